"""A run directory's files read and written whole-lines-only, never a hang, and every
line that is not a result named with its number."""

from __future__ import annotations

import os
import threading

import pytest

from refinery.engine.errors import InvalidRequestError
from refinery.eval.results_file import append_line, compact_traces, parse_results, read_results


def test_a_torn_tail_is_skipped_and_cut_off_when_repairing(tmp_path):
    path = tmp_path / "results.jsonl"
    append_line(path, {"id": "a"})
    with open(path, "ab") as f:
        f.write(b'{"id": "b", "pas')
    assert read_results(path) == [{"id": "a"}]
    assert path.read_bytes().endswith(b'"pas')  # reading alone changes nothing
    assert read_results(path, repair=True) == [{"id": "a"}]
    append_line(path, {"id": "c"})
    assert [r["id"] for r in read_results(path)] == ["a", "c"]


def test_a_fifo_in_place_of_results_reads_as_empty_without_waiting(tmp_path):
    path = tmp_path / "results.jsonl"
    os.mkfifo(path)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(read_results(path)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    waited = reader.is_alive()
    if waited:  # unblock the stuck open() so the suite goes on, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=5)
    assert not waited, "reading a FIFO waited for a writer"
    assert got == [[]]


BAD_LINES = [
    (b"1\n", "a JSON int, not an object"),
    (b'{"id": "x", "usage": [1, 2]}\n', "usage: Input should be a valid dictionary"),
    (b'{"id": "x", "usage": {"prompt_tokens": "many"}}\n', "usage.prompt_tokens"),
    (b'{"id": "\xff\xfe"}\n', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
    (b'{"id": "x", "passed": \n', "not JSON"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_a_line_that_is_not_a_result_is_named_with_its_number(tmp_path, line, reason):
    data = b'{"id": "a", "passed": true}\n' + line + b'{"id": "b"}\n'
    parsed = parse_results(data)
    assert [r["id"] for r in parsed.rows] == ["a", "b"]
    assert [b.number for b in parsed.bad] == [2]
    assert reason in parsed.bad[0].reason
    path = tmp_path / "results.jsonl"
    path.write_bytes(data)
    with pytest.raises(InvalidRequestError, match=r"results.jsonl:2: corrupt result line"):
        read_results(path)


def test_compacting_traces_skips_lines_that_are_not_traces(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b'[1, 2]\n{"task_id": ["x"]}\nnot json\n{"task_id": "a", "n": 1}\n'
                     b'{"task_id": "a", "n": 2}\n')
    compact_traces(path, {"a"})
    assert path.read_bytes() == b'{"task_id": "a", "n": 2}\n'
