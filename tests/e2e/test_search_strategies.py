"""mcts and genselect on the embedded model: one level-1 arith problem that greedy
decoding solves, in process and behind vLLM's own server, and OptiLLM's ``mcts-MODEL``
and ``genselect-MODEL`` through refinery's server.

Both run greedy (``temperature=0.0``). The model gets this problem wrong (mcts: 24,
genselect: 90, for 14), so what is checked is the shape and that the answer is the one
the chosen text states: mcts's simulations (each one
expansion of 2 steps from a chain that starts at the root, the root's visits growing
by 2 a simulation, every step after the first continuing the partial turn, calls
within the declared worst case) and genselect's two calls (3 drafts in one request,
one comparison whose constrained pick always parses).
"""

from __future__ import annotations

import openai
import pytest

from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.trace import Trace
from refinery.eval.arith import load_arith
from refinery.strategies import build
from refinery.verifiers.math import extract_answer
from tests.e2e.solving import run_specs

pytestmark = pytest.mark.e2e

[PROBLEM] = load_arith(limit=1, levels=(1,))
MCTS = 'mcts(scorer="arith", simulations=3, expansions=2, max_steps=3, temperature=0.0)'
GENSELECT = "genselect(n=3, temperature=0.0)"


def check_mcts(trace: Trace) -> None:
    sims = [e.data for e in trace.events if e.kind == "step" and e.step == "search"]
    assert len(sims) == trace.attempt.metadata["simulations"] >= 1
    for k, sim in enumerate(sims):
        assert sim["simulation"] == k and sim["chain"][0] == 0 and len(sim["children"]) == 2
        assert sim["visits"][0] == 2 * (k + 1) and len(sim["scores"]) == 2
    assert trace.attempt.metadata["nodes"] == 1 + 2 * len(sims)
    steps = [e for e in trace.events if e.kind == "generation" and e.step != "loop_retry"]
    assert steps[0].step == "draft" and len(steps[0].completions) == 2
    assert all(e.data.get("continue_final") is True for e in steps[1:])
    assert trace.usage.calls <= build(MCTS).worst_case(build(MCTS).params, []) == 4
    # The 135M model writes its steps as one numbered list, no blank line between them
    # (cut at step_tokens: a finished path): its answer is checked against its own text.
    assert trace.attempt.answer == extract_answer(trace.attempt.text)
    print(f"mcts: {trace.attempt.answer} (gold {PROBLEM.gold}), {len(sims)} simulations")


def check_genselect(trace: Trace) -> None:
    draft, compare = [e for e in trace.events if e.kind == "generation"
                      and e.step != "loop_retry"]
    assert (draft.step, len(draft.completions)) == ("draft", 3)
    assert compare.data["parse"] == {"step": "select", "parsed": [True], "structured": True}
    [select] = [e for e in trace.events if e.kind == "step" and e.step == "select"]
    assert select.data["how"] == "parsed" and select.data["pick"] in (1, 2, 3)
    assert trace.attempt.metadata["pick"] == select.data["pick"]
    meta = trace.attempt.metadata
    assert trace.attempt.answer == meta["draft_answers"][meta["pick"] - 1]
    print(f"genselect: {trace.attempt.answer} (gold {PROBLEM.gold}) of {meta['draft_answers']}")


CHECKS = {MCTS: check_mcts, GENSELECT: check_genselect}


async def test_mcts_and_genselect_in_process(vllm_backend, tmp_path):
    runs = await run_specs(list(CHECKS), [PROBLEM.to_task()], vllm_backend, tmp_path)
    for spec, check in CHECKS.items():
        [trace] = runs[spec].written
        check(trace)


async def test_mcts_and_genselect_behind_a_vllm_server(vllm_server, tmp_path):
    backend = OpenAIBackend(DEFAULT_MODEL, vllm_server, config=OpenAIConfig(upstream="vllm"))
    try:
        runs = await run_specs(list(CHECKS), [PROBLEM.to_task()], backend, tmp_path)
    finally:
        await backend.aclose()
    for spec, check in CHECKS.items():
        [trace] = runs[spec].traces
        check(trace)


@pytest.mark.parametrize("approach,spec", [
    ("mcts", "mcts(simulations=2, exploration=0.2)"), ("genselect", "genselect(cot)")])
async def test_optillm_prefixes_run_them(server_url, approach, spec):
    client = openai.AsyncOpenAI(base_url=server_url + "/v1", api_key="none", max_retries=0)
    r = await client.chat.completions.create(
        model=f"{approach}-{DEFAULT_MODEL}", max_tokens=64,
        messages=[{"role": "user", "content": PROBLEM.prompt}])
    assert r.model_extra["refinery"]["strategy"] == spec
    assert r.model_extra["refinery"]["calls"] >= 2 and r.choices[0].message.content.strip()
