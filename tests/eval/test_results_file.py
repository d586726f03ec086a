"""A run directory's files read and written whole-lines-only, and never a hang."""

from __future__ import annotations

import os
import threading

from refinery.eval.results_file import append_line, read_results


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
