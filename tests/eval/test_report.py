"""Reports: the markdown table's numbers and the PNG plots of two constructed runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.report import _label_lifts, _top, load_run, pareto_front, write_report
from refinery.eval.runner import CONFIG, RESULTS, append_line

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(path: Path, strategy: str, passed: list[bool], tokens: int, calls: int,
             seconds: float, dataset: str = "arith", gsm8k: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / CONFIG).write_text(json.dumps({
        "strategy": {"spec": strategy, "canonical": strategy}, "model": DEFAULT_MODEL,
        "dataset": {"name": dataset, "n_problems": len(passed)}}))
    for i, ok in enumerate(passed):
        append_line(path / RESULTS, {
            "id": f"p{i}", "level": 1 + i % 2, "passed": ok,
            "strict_match": (not ok) if gsm8k else None, "flexible_match": ok if gsm8k else None,
            "usage": {"prompt_tokens": tokens // 4, "completion_tokens": tokens - tokens // 4,
                      "calls": calls},
            "seconds": seconds, "error": None, "session": "s", "session_start": 1000.0,
            "time": 1000.0 + 2 * (i + 1)})
    return path


def test_pareto_front() -> None:
    pts = [(100, 0.5), (200, 0.4), (300, 0.7), (300, 0.6), (50, 0.1), (400, 0.7)]
    assert pareto_front(pts) == [4, 0, 2]
    assert pareto_front([(1, 1)]) == [0]
    assert pareto_front([]) == []


def test_plot_axis_fits_small_accuracies_and_labels_do_not_overlap() -> None:
    # A 135M model's few percent would sit on the floor of a 0-100% axis.
    assert _top([5.0, 8.3]) == pytest.approx(10.375)
    assert _top([1.0, 2.0]) == 10.0
    assert _top([90.0]) == 102.0
    # sc and sage at ~1,900 tokens and 4% / 2.5%: the costlier one's label goes up a
    # line; cot, far away in tokens, and ssr, far away in both, keep theirs.
    assert _label_lifts([349, 1899, 1913, 12141], [2.0, 4.0, 2.5, 1.5]) == [0, 0, 11, 0]
    assert _label_lifts([1899, 1913, 2196], [4.0, 2.5, 4.5]) == [0, 11, 22]


def test_report_on_two_runs_writes_table_and_plots(tmp_path) -> None:
    a = make_run(tmp_path / "runs" / "cot", "cot", [True, False, True, False], 100, 1, 1.5)
    b = make_run(tmp_path / "runs" / "sc4", "sc(cot, n=4)", [True, True, True, False], 400, 1,
                 3.0)
    files = write_report([a, b], tmp_path / "docs", name="arith", title="Arith")
    md = Path(files.markdown).read_text()
    assert files.markdown == str(tmp_path / "docs" / "arith.md") and md.startswith("# Arith")
    assert len(files.images) == 2
    for img in files.images:
        data = Path(img).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
        assert f"(img/{Path(img).name})" in md
    main = md.split("\n\n")[1]  # the first table, after the heading
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in main.splitlines() if re.match(r"\| (cot|sc4) \| `", line)}
    assert len(rows) == 2
    # run | strategy | dataset | model | n | accuracy | tokens | calls | latency | wall | errors
    assert rows["cot"][1:5] == ["`cot`", "arith", DEFAULT_MODEL, "4"]
    assert rows["cot"][5] == "50.0% (15.0–85.0)"
    assert rows["sc4"][5] == "75.0% (30.1–95.4)"
    assert rows["cot"][6:] == ["100.0", "1.00", "1.50", "2.00", "0"]
    assert rows["sc4"][6:] == ["400.0", "1.00", "3.00", "2.00", "0"]
    # levels: p0, p2 are level 1; p1, p3 level 2
    assert "| cot | `cot` | arith | 100% (2/2) | 0% (0/2) |" in md
    assert "| sc4 | `sc(cot, n=4)` | arith | 100% (2/2) | 50% (1/2) |" in md


def test_report_gsm8k_metrics_and_partial_runs(tmp_path) -> None:
    run = make_run(tmp_path / "g", "cot", [True, False, False], 10, 2, 1.0, dataset="gsm8k",
                   gsm8k=True)
    cfg = json.loads((run / CONFIG).read_text())
    cfg["dataset"]["n_problems"] = 5  # 3 of 5 done: an interrupted run
    (run / CONFIG).write_text(json.dumps(cfg))
    r = load_run(run)
    assert (r.n, r.planned, r.accuracy.correct) == (3, 5, 1)
    assert (r.strict.correct, r.flexible.correct) == (2, 1)
    md = Path(write_report([run], tmp_path / "out").markdown).read_text()
    assert "| 3 of 5 |" in md and "strict-match" in md
    assert "| g | `cot` | 66.7% (20.8–93.9) | 33.3% (6.1–79.2) | 33.3% (6.1–79.2) |" in md


def test_report_rejects_a_non_run_dir(tmp_path) -> None:
    from refinery.engine.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="not a run directory"):
        write_report([tmp_path], tmp_path / "docs")


@pytest.mark.parametrize(("config", "says"), [
    ("[1, 2]", "config.json is a JSON list, not an object"),
    ('{"dataset": "gsm8k"}', "config.json: dataset: Input should be"),
    ('{"strategy": {"spec": 3}}', "config.json: strategy.spec: Input should be"),
    ("{not json", "config.json is not JSON"),
])
def test_a_config_that_is_not_a_run_config_is_refused_by_name(tmp_path, config, says) -> None:
    from refinery.engine.errors import InvalidRequestError

    run = make_run(tmp_path / "r", "cot", [True], 10, 1, 1.0)
    (run / CONFIG).write_text(config)
    with pytest.raises(InvalidRequestError, match=re.escape(says)):
        load_run(run)
