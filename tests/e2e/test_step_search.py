"""Step search on the embedded model: beam, dvts and particle with the arith and judge
scorers, through real vLLM in process and behind vLLM's own server.

What must hold whatever the model writes: every level is a search event whose
kept and pruned paths partition the population it scored, beam keeps at most
its width, particle filtering resamples back to its n, every step's score is a
probability (the arith scorer's one of right, unchecked, wrong), each step after
the first continues the partial assistant turn (only a first step that loops
is retried, by the context's loop policy), and the answer's score is its
path's aggregated score.
"""

from __future__ import annotations

import pytest

from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.trace import Trace
from refinery.eval.datasets import load_arith
from refinery.verifiers.step_arith import RIGHT, UNCHECKED, WRONG
from tests.e2e.solving import run_specs

pytestmark = pytest.mark.e2e

ARITH = [e.to_task() for e in load_arith(limit=2)]
BEAM = 'beam(scorer="{}", width=2, expand=2, max_steps=3)'
DVTS = 'dvts(scorer="{}", n=4, width=2, max_steps=3)'
PARTICLE = 'particle(scorer="{}", n=4, max_steps=3)'


def check_search(spec: str, traces: list[Trace]) -> None:
    for t in traces:
        levels = [e.data for e in t.events if e.kind == "step" and e.step == "search"]
        assert levels, (spec, t.task_id)
        for level in levels:
            scored = len(level["scores"])
            assert sorted({*level["kept"], *level["pruned"]}) == list(range(scored)), level
            assert not set(level["kept"]) & set(level["pruned"])
            assert all(0.0 <= s <= 1.0 for s in level["scores"])
            if spec.startswith("beam"):
                assert len(level["kept"]) <= 2
            if spec.startswith("particle") and scored:
                assert len(level["kept"]) == 4  # resampled, with repeats, back to n
        steps = [e for e in t.events if e.kind == "generation" and e.strategy != "judge"
                 and e.step != "loop_retry"]  # the context's policy for a looping first step
        assert steps[0].step == "draft"
        assert all(e.data.get("continue_final") is True for e in steps[1:]), spec
        assert t.attempt.score == pytest.approx(t.attempt.metadata["score"])
        if "arith" in spec:  # aggregate "last": the last step's verdict
            assert t.attempt.score in (RIGHT, UNCHECKED, WRONG)
        else:
            judged = [e for e in t.events if e.strategy == "judge"]
            assert judged and all(e.data.get("continue_final") is None for e in judged)


async def test_beam_dvts_and_particle_in_process(vllm_backend, tmp_path):
    # All six at once: their calls batch in the one engine.
    specs = [s.format(scorer) for scorer in ("arith", "judge") for s in (BEAM, DVTS, PARTICLE)]
    runs = await run_specs(specs, ARITH, vllm_backend, tmp_path, max_tokens=256)
    for spec in specs:
        check_search(spec, runs[spec].traces)


async def test_beam_and_particle_behind_a_vllm_server(vllm_server, tmp_path):
    backend = OpenAIBackend(DEFAULT_MODEL, vllm_server, config=OpenAIConfig(upstream="vllm"))
    specs = [BEAM.format("arith"), PARTICLE.format("judge")]
    try:
        runs = await run_specs(specs, ARITH, backend, tmp_path, max_tokens=256)
    finally:
        await backend.aclose()
    for spec in specs:
        check_search(spec, runs[spec].traces)
