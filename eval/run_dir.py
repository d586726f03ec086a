"""A run directory's identity: the ``config.json`` a resume must match, and the rows already done.

``config.json`` records what defines the run (:meth:`EvalConfig.identity
<refinery.eval.runner.EvalConfig.identity>`: dataset and a fingerprint of its
problems, strategy, model, sampling, budget) and, for the record, the rest (the
strategy's graph, the backend, the code version). A rerun into the same
directory continues it only if the identities match; otherwise it is refused,
or with ``force`` the old files are moved aside into ``replaced-<time>/``.

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> prepare_run_dir(out, {"identity": {"dataset": "arith"}}, force=False)
    >>> try:
    ...     prepare_run_dir(out, {"identity": {"dataset": "gsm8k"}}, force=False)
    ... except ConfigMismatchError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    /... holds a run with a different configuration (dataset: recorded 'arith', now 'gsm8k'). ...
    >>> prepare_run_dir(out, {"identity": {"dataset": "gsm8k"}}, force=True)
    >>> sorted(p.name.split("-")[0] for p in out.iterdir())
    ['config.json', 'replaced']
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import networkx as nx

from refinery.engine.errors import InvalidRequestError
from refinery.eval.datasets import REPO
from refinery.eval.example import Example, dataset_fingerprint
from refinery.eval.results_file import (
    compact_traces,
    read_results,
    rewrite,
    snapshot,
    write_json_atomic,
)
from refinery.strategies.spec import non_default, to_mermaid

if TYPE_CHECKING:  # the runner's config; the runner imports this module
    from refinery.eval.runner import EvalConfig

__all__ = ["CONFIG", "FORMAT", "RESULTS", "TRACES", "ConfigMismatchError", "code_version",
           "finished_rows", "graph_json", "prepare_run_dir", "run_record"]

CONFIG, RESULTS, TRACES = "config.json", "results.jsonl", "traces.jsonl"
FORMAT = "refinery-eval/1"


class ConfigMismatchError(InvalidRequestError):
    """The output directory holds a run with a different configuration."""


def code_version() -> dict[str, Any]:
    """Git commit (and whether the tree is dirty) of the code, plus the package version."""
    out: dict[str, Any] = {"git_commit": None, "git_dirty": None, "package_version": None,
                           "python": sys.version.split()[0]}
    try:
        from importlib.metadata import version
        out["package_version"] = version("refinery")
    except Exception:  # not installed (running from a checkout)
        pass
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=5)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
            st = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"],
                                capture_output=True, text=True, timeout=10)
            out["git_dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def graph_json(g: nx.DiGraph) -> dict[str, Any]:
    """A validated strategy graph as plain JSON (nodes with params and worst-case calls)."""
    nodes = []
    for nid, data in g.nodes(data=True):
        params = data.get("params")
        nodes.append({"id": nid, "name": data["name"],
                      "params": params.model_dump(mode="json") if params is not None else {},
                      "non_default": (non_default(params) if params is not None else {}),
                      "worst_case_calls": data.get("calls")})
    edges = [{"parent": a, "child": b, "order": d.get("order", 0)}
             for a, b, d in g.edges(data=True)]
    return {"root": g.graph.get("root"), "nodes": nodes, "edges": edges}


def run_record(config: EvalConfig, canonical: str, graph: nx.DiGraph,
               examples: list[Example]) -> dict[str, Any]:
    """``config.json``: the identity a resume must match, and the rest for the record."""
    fingerprint = dataset_fingerprint(examples)
    return {
        "format": FORMAT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "identity": config.identity(canonical, fingerprint, len(examples)),
        "dataset": {"name": config.dataset, "split": config.split, "limit": config.limit,
                    "skip": config.skip,
                    "data_path": config.data_path, "fields": config.fields,
                    "verifier": config.verifier, "seed": config.seed, "levels": config.levels,
                    "n_problems": len(examples), "fingerprint": fingerprint,
                    "has_levels": any(e.level is not None for e in examples)},
        "strategy": {"spec": config.strategy, "canonical": canonical,
                     "worst_case_calls": graph.graph.get("worst_case_calls"),
                     "graph": graph_json(graph), "mermaid": to_mermaid(graph)},
        "model": config.model,
        "backend": {"kind": config.backend, "base_url": config.base_url},
        "ray": config.ray.recorded() if config.ray else None,
        "sampling": config.sampling().model_dump(),
        "budget": config.budget().model_dump(),
        "concurrency": config.concurrency,
        "code": code_version(),
    }


def prepare_run_dir(out: Path, record: dict[str, Any], force: bool) -> None:
    """Create the run dir or check it holds the same run; with ``force`` move an old run aside.

    Raises:
        ConfigMismatchError: ``out`` holds another run (or results without a config, or an
            unreadable config) and ``force`` is off.
    """
    out.mkdir(parents=True, exist_ok=True)
    cfg_path = out / CONFIG
    if cfg_path.exists():
        old_id, new_id = _recorded_identity(cfg_path), record["identity"]
        if old_id == new_id:
            return
        diffs = [f"{k}: recorded {old_id.get(k)!r}, now {new_id.get(k)!r}"
                 for k in sorted(set(old_id) | set(new_id)) if old_id.get(k) != new_id.get(k)]
        if not force:
            raise ConfigMismatchError(
                f"{out} holds a run with a different configuration ("
                + "; ".join(diffs) + "). Use a new --out directory, or --force to move "
                "the old run aside and start over.")
        _move_aside(out, (CONFIG, RESULTS, TRACES))
    elif (out / RESULTS).exists() and not force:
        raise ConfigMismatchError(f"{out} has {RESULTS} but no {CONFIG}; use --force or a "
                                  "new --out directory")
    elif (out / RESULTS).exists():
        _move_aside(out, (RESULTS, TRACES))
    write_json_atomic(cfg_path, record)


def _move_aside(out: Path, names: tuple[str, ...]) -> None:
    """Move the files ``names`` of ``out`` that exist into a new ``replaced-<time>/``."""
    aside = out / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    for name in names:
        if (out / name).exists():
            shutil.move(str(out / name), str(aside / name))


def _recorded_identity(cfg_path: Path) -> dict[str, Any]:
    """The ``identity`` an existing ``config.json`` records.

    Raises:
        ConfigMismatchError: the file is unreadable, not a JSON object, or not a regular
            file (a FIFO reads as empty: it never blocks the run).
    """
    try:
        old = json.loads(snapshot(cfg_path))
    except (OSError, ValueError) as exc:
        raise ConfigMismatchError(f"{cfg_path} is unreadable ({exc}); use --force or "
                                  "a new --out directory") from exc
    identity = old.get("identity", {}) if isinstance(old, dict) else None
    if not isinstance(identity, dict):
        raise ConfigMismatchError(f"{cfg_path} records no run identity; use --force or "
                                  "a new --out directory")
    return identity


def finished_rows(out: Path, examples: list[Example], retry_errors: bool) -> list[dict[str, Any]]:
    """The rows already in ``out``: the first per problem of this run (a torn last line
    repaired; with ``retry_errors`` the failed ones dropped), traces compacted to them."""
    results_path = out / RESULTS
    rows = read_results(results_path, repair=True)
    if retry_errors and any(r.get("error") for r in rows):
        rows = [r for r in rows if not r.get("error")]
        rewrite(results_path, [(json.dumps(r, ensure_ascii=False) + "\n").encode()
                                for r in rows])
    ids = {e.id for e in examples}
    current, seen = [], set()
    for r in rows:  # first line per problem (there is one, unless edited by hand)
        if r.get("id") in ids and r["id"] not in seen:
            seen.add(r["id"])
            current.append(r)
    compact_traces(out / TRACES, seen)
    return current
