"""interrupt_on_sigterm(): a SIGTERMed program runs its ``finally`` blocks.

That is what closes a vLLM engine, whose core process would otherwise outlive
its parent. The real engine's side is tests/eval/test_sigterm.py; here a plain
asyncio program stands in for a bench, with and without the handler.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from refinery.engine.console import interrupt_on_sigterm

    async def main(marker):
        print("ready", flush=True)
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0)  # an awaited close, as backend.aclose() is
            marker.write_text("closed")

    if __name__ == "__main__":
        if sys.argv[2] == "install":
            interrupt_on_sigterm()
        asyncio.run(main(Path(sys.argv[1])))
""")


def _terminate(tmp_path: Path, mode: str) -> tuple[int, str]:
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(marker), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # inside the sleep
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    return proc.returncode, marker.read_text() if marker.exists() else ""


@pytest.mark.parametrize("mode, code, marker", [
    ("install", -signal.SIGINT, "closed"),  # unwound as Ctrl-C: the finally ran
    ("default", -signal.SIGTERM, ""),       # what the benches did before: no finally
])
def test_sigterm_unwinds_like_ctrl_c_only_with_the_handler(tmp_path, mode, code, marker):
    assert _terminate(tmp_path, mode) == (code, marker)


def test_a_refused_option_exits_2_naming_it(capsys):
    import typer
    from pydantic import BaseModel, Field, ValidationError

    from refinery.engine.console import USAGE, bad_option

    class Config(BaseModel):
        concurrency: int = Field(ge=1)

    with pytest.raises(ValidationError) as refused:
        Config(concurrency=0)
    with pytest.raises(typer.Exit) as exited:
        bad_option(refused.value)
    assert exited.value.exit_code == USAGE
    assert "bad option concurrency: Input should be greater than or equal to 1" in \
        capsys.readouterr().err
