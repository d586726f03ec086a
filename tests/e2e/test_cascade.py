"""cascade on the embedded model: pot first, a vote over pot only when no program ran.

Whatever the model writes: the signal's reading is traced and decides whether the
vote ran, and an escalated vote counts pot's program, drawing one more, not two.
"""

from __future__ import annotations

import pytest

from refinery.eval.datasets import load_arith
from tests.e2e.solving import run_specs

pytestmark = pytest.mark.e2e

SPEC = "cascade(pot, sc(pot, n=2), until=ran)"


async def test_cascade_keeps_pot_when_it_ran_and_votes_only_when_not(vllm_backend, tmp_path):
    tasks = [e.to_task() for e in load_arith(limit=1)]
    [trace] = (await run_specs([SPEC], tasks, vllm_backend, tmp_path))[SPEC].traces
    meta = trace.attempt.metadata
    [check] = meta["checks"]
    [event] = [e for e in trace.events if e.step == "threshold"]
    assert (event.data["signal"], event.data["sure"]) == ("ran", check["sure"])
    runs = [e.data for e in trace.events if e.step == "execute"]
    drafts = [e for e in trace.events if e.kind == "generation" and e.step == "draft"]
    if check["sure"]:  # pot's program ran and printed its answer: the vote never ran
        assert meta["stage"] == 1 and len(drafts) == 1
        assert trace.attempt.answer in {r["answer"] for r in runs if r["ok"]}
        assert event.text.endswith("stage 2 sc(pot, n=2) not entered")
    else:  # the vote's first sample is pot's: one program more in one request
        assert meta["stage"] == 2 and meta["candidates"] == 2
        assert [len(e.completions) for e in drafts] == [1, 1]
        assert event.text.endswith("stage 2 sc(pot, n=2) entered")
