"""self_debug on a scripted backend, its checks run in the real sandbox."""

from __future__ import annotations

from refinery.engine.types import Task
from refinery.eval.datasets import load_humaneval
from refinery.strategies.cot import CoT
from refinery.strategies.execution import execution_sandbox
from refinery.strategies.self_debug import SelfDebug, visible_examples
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx

PROMPT = '''Complete the function.
```python
from typing import List

def total(xs: List[int]) -> int:
    """Sum of xs.
    >>> total([1, 2, 3])
    6
    >>> total([])
    0
    """
```'''
WRONG = "```python\ndef total(xs):\n    return len(xs)\n```"
RIGHT = "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```"


def code_task() -> Task:
    return Task.from_prompt(PROMPT, id="he-1", metadata={"entry_point": "total"})


def test_the_examples_come_from_the_prompt_or_the_caller():
    assert visible_examples(code_task()) == [("total([1, 2, 3])", "6"), ("total([])", "0")]
    given = code_task().model_copy(update={"metadata": {"visible_tests": [["total([5])", "5"]]}})
    assert visible_examples(given) == [("total([5])", "5")]


async def test_a_failing_function_gets_its_failures_back_and_the_fix_is_kept():
    backend = ScriptedBackend([(r"fails these examples", RIGHT), (r".*", WRONG)])
    attempt = await SelfDebug(CoT(), rounds=2).solve(code_task(), ctx(backend))
    fix = backend.calls[1].messages[-1].content
    assert "total([1, 2, 3]): expected 6, got 3" in fix and "total([])" not in fix
    assert attempt.text == RIGHT and attempt.metadata["examples_passed"] == 2
    assert len(backend.calls) == 2  # passing all examples ends the loop


async def test_rounds_bound_the_fixes_and_the_best_candidate_is_kept():
    half = "```python\ndef total(xs):\n    return 0\n```"  # passes total([]) only
    raises = "```python\ndef total(xs):\n    return xs / 0\n```"  # passes none
    backend = ScriptedBackend([(r"fails these examples", raises), (r".*", half)])
    attempt = await SelfDebug(CoT(), rounds=2).solve(code_task(), ctx(backend))
    assert len(backend.calls) == 3 and attempt.text == half
    assert attempt.metadata["examples_passed"] == 1


async def test_hidden_tests_never_reach_the_sandbox(monkeypatch):
    [example] = load_humaneval(limit=1)
    hidden = example.private["tests"]
    task = example.to_task()
    assert hidden not in task.model_dump_json()  # the strategy's task does not hold them
    programs: list[str] = []
    sandbox = execution_sandbox()
    real = sandbox.run_python

    async def spy(source, **kw):
        programs.append(source)
        return await real(source, **kw)

    monkeypatch.setattr(sandbox, "run_python", spy)
    backend = ScriptedBackend([(r".*", "```python\ndef x():\n    return 1\n```")])
    await SelfDebug(CoT(), rounds=1).solve(task, ctx(backend))
    assert programs and all("def check(candidate)" not in p for p in programs)
    assert all(hidden.strip() not in p for p in programs)
