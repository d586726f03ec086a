"""Serving a ``refinery tune`` profile: effort levels and the auto presets."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from refinery.cli.serve import serve
from refinery.engine.errors import InvalidRequestError
from refinery.serving.config import DEFAULT_PRESETS, ServerConfig, effort_levels, profile_settings
from refinery.serving.service import Service
from refinery.strategies import build_with_graph
from refinery.strategies.profile import Candidate, CandidateStats, Profile


def write_profile(directory: Path, dataset: str = "arith") -> Path:
    stats = [CandidateStats.of(Candidate(spec=spec, temperature=t), passed,
                               tokens=tokens, calls=calls, seconds=1.0)
             for spec, t, passed, tokens, calls in (
                 ("cot", 0.0, [True, False, False, False], 100.0, 1.0),
                 ("sc(cot, n=2)", 0.7, [True, True, False, False], 200.0, 2.0),
                 ("sc(cot, n=4)", 0.7, [True, True, True, True], 400.0, 4.0))]
    Profile.build(dataset, "smollm2-135m", stats).save(directory)
    return directory


def test_levels_and_presets_of_profiles(tmp_path: Path) -> None:
    first = write_profile(tmp_path / "a", "arith")
    second = write_profile(tmp_path / "b", "gsm8k")
    effort, presets = profile_settings([first, second])
    assert effort["high"].spec == f"auto(profile={str(first)!r}, level='high')"
    assert effort["low"].spec == f"auto(profile={str(first)!r}, level='low')"
    assert effort["high"].max_tokens == 65_536
    assert effort["none"].spec is None
    assert presets == {"auto": f"auto(profile={str(first)!r})",
                       "auto-arith": f"auto(profile={str(first)!r})",
                       "auto-gsm8k": f"auto(profile={str(second)!r})"}
    assert effort_levels(["high=cot"], effort)["high"].spec == "cot"
    assert effort_levels([], effort)["low"] == effort["low"]


def test_bad_profile_dir(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="no profile at"):
        profile_settings([tmp_path / "missing"])
    result = CliRunner().invoke(serve, ["--profile", str(tmp_path / "missing")])
    assert result.exit_code != 0
    assert "--profile: no profile at" in result.output


def test_service_resolves_profile_levels_and_auto(tmp_path: Path) -> None:
    directory = write_profile(tmp_path / "a")
    effort, presets = profile_settings([directory])
    config = ServerConfig(effort=effort, presets={**DEFAULT_PRESETS, **presets},
                          profiles=(directory,), store=None)
    service = Service(config)
    spec, level = service.resolve_spec("smollm2-135m", effort="high")
    assert spec == f"auto(profile={str(directory)!r}, level='high')"
    assert level == effort["high"]
    spec, _ = service.resolve_spec("auto@smollm2-135m")
    assert spec == f"auto(profile={str(directory)!r})"
    assert service.resolve_spec("smollm2-135m", effort="none")[0] is None


def test_profile_specs_build(tmp_path: Path) -> None:
    effort, presets = profile_settings([write_profile(tmp_path / "a")])
    for spec in [effort[level].spec for level in ("low", "medium", "high")] + [presets["auto"]]:
        build_with_graph(spec, max_calls=None)
