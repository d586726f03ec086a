"""A run directory's identity: a resume into another run is refused, never a hang."""

from __future__ import annotations

import os
import threading

from refinery.eval.run_dir import CONFIG, ConfigMismatchError, prepare_run_dir


def test_a_run_config_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / CONFIG)
    got: list = []

    def prepare() -> None:
        try:
            prepare_run_dir(out, {"identity": {"a": 1}}, force=False)
        except ConfigMismatchError as exc:
            got.append(exc)

    worker = threading.Thread(target=prepare, daemon=True)
    worker.start()
    worker.join(timeout=10)
    waited = worker.is_alive()
    if waited:  # unblock the stuck open() so the suite goes on, then fail
        os.close(os.open(out / CONFIG, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=5)
    assert not waited, "reading the FIFO config waited for a writer"
    assert len(got) == 1 and "unreadable" in str(got[0])
