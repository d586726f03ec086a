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
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from refinery.engine.console import interrupt_on_sigterm

    async def main(marker):
        try:
            print("ready", flush=True)  # inside the try: a SIGTERM from now on unwinds it
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
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    return proc.returncode, marker.read_text() if marker.exists() else ""


@pytest.mark.parametrize("mode, code, marker", [
    ("install", -signal.SIGINT, "closed"),  # unwound as Ctrl-C: the finally ran
    ("default", -signal.SIGTERM, ""),       # what the benches did before: no finally
])
def test_sigterm_unwinds_like_ctrl_c_only_with_the_handler(tmp_path, mode, code, marker):
    assert _terminate(tmp_path, mode) == (code, marker)
