"""A small arith run through ``refinery.eval.runner.run_eval`` with a slow scripted model, run as a
subprocess by the resume test (which SIGKILLs it part-way). Not a shipped backend.

    python -m tests.eval._resume_worker OUT N DELAY_SECONDS
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from refinery.eval.runner import EvalConfig, run_eval
from tests.scripted_backend import ScriptedBackend


@dataclass
class SlowBackend(ScriptedBackend):
    """The scripted test double, answering after ``delay`` seconds."""

    delay: float = 0.0

    async def generate(self, messages, params, *, n=None, stop_rule=None):
        await asyncio.sleep(self.delay)
        return await super().generate(messages, params, n=n, stop_rule=stop_rule)


def config(out: str, n: int) -> EvalConfig:
    return EvalConfig(dataset="arith", strategy="cot", limit=n, out=out, model="scripted",
                      concurrency=4, temperature=0.0)


def backend(delay: float) -> SlowBackend:
    return SlowBackend([(r"Maya|Noah|Olga", "I think it is \\boxed{7}."),
                        (r".*", "Let me count. The answer is \\boxed{14}.")], delay=delay)


def main() -> None:
    out, n, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    summary = asyncio.run(run_eval(config(out, n), backend=backend(delay), progress=False))
    print(summary.model_dump_json())


if __name__ == "__main__":
    main()
