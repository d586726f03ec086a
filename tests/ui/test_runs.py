"""The runs list over many runs: each run is read once per version of its files, with
no fixed cap on how many are kept, so a warm list of 1,000 runs reads no run file."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from refinery.ui import UISettings, create_ui_app
from refinery.ui.runs import RUN_FILES, RUN_ROWS, list_runs

RUNS = 1000


def write_runs(root: Path, n: int) -> None:
    for i in range(n):
        run = root / f"run-{i:04d}"
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({
            "model": "m", "dataset": {"name": "toy", "n_problems": 10},
            "strategy": {"spec": "cot"}}))
        (run / "results.jsonl").write_text("".join(
            json.dumps({"id": f"p{j}", "index": j, "passed": j % 2 == 0}) + "\n"
            for j in range(10)))


def test_a_warm_list_of_1000_runs_reads_no_run_again(tmp_path) -> None:
    write_runs(tmp_path, RUNS)
    first = list_runs(tmp_path)
    assert len(first) == RUNS and first[0].report.n == 10
    hits, misses, file_misses = RUN_ROWS.hits, RUN_ROWS.misses, RUN_FILES.misses
    again = list_runs(tmp_path)
    assert [r.name for r in again] == [r.name for r in first]
    assert RUN_ROWS.hits - hits == RUNS and RUN_ROWS.misses == misses
    assert RUN_FILES.misses == file_misses  # past the 128 runs of a fixed cap
    with open(tmp_path / "run-0500" / "results.jsonl", "a") as f:
        f.write(json.dumps({"id": "p10", "index": 10, "passed": True}) + "\n")
    changed = list_runs(tmp_path)
    assert RUN_ROWS.misses == misses + 1 and changed[500].report.n == 11


def test_the_runs_page_lists_them_all(tmp_path) -> None:
    write_runs(tmp_path, 140)
    client = TestClient(create_ui_app(UISettings(runs=tmp_path, draw_in_process=False)))
    for _ in range(2):
        r = client.get("/ui/runs")
        assert r.status_code == 200 and "140 runs under" in r.text
        assert r.text.count('<td><a href="/ui/run?path=run-') == 140
