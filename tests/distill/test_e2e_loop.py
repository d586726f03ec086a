"""One round of the distillation loop on ``arith`` with the real model, end to end.

A PMD round: ``sc(pot, n=4)`` on 4 train problems with the session's base engine,
the round's memory store from those attempts, the self-teacher's run with that
memory -> its verified programs as worked solutions (prompts without the memory)
-> LoRA SFT (2 steps, in a child process) -> merge -> a second vLLM engine on the
merged checkpoint evaluates plain cot on 4 held-out problems. Both tests read the
one round: a plain (RAFT) round runs the same sampling, training, merge and
evaluation, and differs only in where its rows come from and in having no memory
(tests/distill/test_pipeline.py checks both on stand-ins). If the 135M model
verifiably solves fewer than 4 rows' worth of train problems, reference solutions
fill up to 4 rows (``gold_fallback_rows``): the point here is the plumbing.
"""

from __future__ import annotations

import json
import os

import pytest

from refinery import strategies
from refinery.distill.loop import loop
from refinery.distill.schema import read_rows
from refinery.distill.train import read_train_record
from refinery.engine.models import DEFAULT_MODEL, resolve_model
from refinery.engine.run import solve_one
from refinery.engine.trace import read_traces
from refinery.engine.types import Task
from refinery.strategies.memory_store import Lesson, MemoryStore

pytestmark = pytest.mark.e2e

TRAIN_SIZE = 4
TRAIN = {"max_steps": 2, "batch_size": 4, "max_length": 256, "loss_eval_rows": 8,
         "learning_rate": 3e-4}


async def _round(backend, out, **options):
    # Training threads left to the default (the idle cores): the session engine is
    # idle while it trains.
    report = await loop("arith", "sc(pot, n=4)", rounds=1, train_size=TRAIN_SIZE,
                        eval_size=4, out=str(out), backend=backend, progress=False, max_tokens=192,
                        gold_fallback_rows=4, eval_sampler=False, train=TRAIN, **options)
    [r] = report.rounds
    return r


def _check_rows_and_checkpoint(r, out) -> list:
    """Rows verified (or gold), a trained and merged checkpoint that vLLM answered with."""
    from safetensors.torch import load_file

    rows = read_rows(out / "round-1" / "sft.jsonl", "sft")
    assert len(rows) == r.build.sft_rows >= 4
    own = [x for x in rows if x.metadata.verifier != "gold"]
    assert len(own) == r.build.sft_rows - r.gold_rows
    for x in own:  # verified programs, distilled as the worked solutions they compute
        assert x.metadata.strategy == "pot" and x.metadata.model == DEFAULT_MODEL
        assert "```" not in x.messages[-1].content
        assert x.messages[-1].content.endswith(f"\\boxed{{{x.metadata.answer}}}.")
    rec = read_train_record(out / "round-1" / "model")
    assert rec.sft.steps == 2 and len(rec.sft.losses) == 2
    assert 1 <= rec.threads <= len(os.sched_getaffinity(0))
    base = load_file(f"{resolve_model(DEFAULT_MODEL)}/model.safetensors")
    new = load_file(str(out / "round-1" / "model" / "model.safetensors"))
    changed = {k for k in base if not (new[k].float() == base[k].float()).all()}
    assert changed == {k for k in base if k.endswith("proj.weight")}  # all-linear LoRA
    results = [json.loads(x) for x in
               (out / "round-1" / "eval" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 4 and r.accuracy_after.n == 4 and r.accuracy_before.n == 4
    assert all(x["model"] == r.model_out and x["error"] is None and x["text"].strip()
               for x in results)
    return rows


@pytest.fixture(scope="module")
async def pmd_round(vllm_backend, tmp_path_factory):
    out = tmp_path_factory.mktemp("loop") / "pmd"
    return out, await _round(vllm_backend, out, pmd=True, max_lessons=4)


async def test_one_round_samples_programs_trains_and_serves_the_merged_weights(
        pmd_round) -> None:
    out, r = pmd_round
    assert r.model_out == str((out / "round-1" / "model").resolve())
    _check_rows_and_checkpoint(r, out)
    sample = read_traces(out / "round-1" / "sample" / "traces.jsonl")
    assert len(sample) == TRAIN_SIZE
    assert all(any(e.step == "execute" for e in t.events) for t in sample)
    assert "| 1 |" in (out / "loop.md").read_text()


async def test_one_pmd_round_teaches_with_memory_and_trains_without(pmd_round,
                                                                     vllm_backend) -> None:
    out, r = pmd_round
    rows = read_rows(out / "round-1" / "sft.jsonl", "sft")
    assert {x.metadata.source_run for x in rows if x.metadata.verifier != "gold"} <= \
        {str(out / "round-1" / "teacher")}
    store_dir = out / "round-1" / "memory"
    store = MemoryStore.load(store_dir)
    assert r.memory is not None and r.memory.trajectories == len(store.trajectories) > 0
    assert r.memory.lessons_kept == len(store.lessons) <= r.memory.lessons_written <= 4
    # The teacher solved every train problem with the memory strategy; the student's
    # rows are the questions as asked.
    teacher = read_traces(out / "round-1" / "teacher" / "traces.jsonl")
    assert len(teacher) == TRAIN_SIZE
    assert all(t.strategy.startswith("memory(") for t in teacher)
    assert all(any(e.step == "memory" for e in t.events) for t in teacher)
    assert not any("Lessons from similar problems" in m.content for x in rows
                   for m in x.messages)
    # The store the loop wrote, with one more lesson, is what `memory` puts in a prompt.
    question = teacher[0].task.question
    store.lessons.append(Lesson(id="l-test", problem_id="x", question=question,
                                lesson="Write each step on its own line.", author="test"))
    store.save(store_dir)
    spec = f"memory(cot, store={json.dumps(str(store_dir))}, k=16)"
    trace = await solve_one(strategies.build(spec), Task.from_prompt(question), vllm_backend)
    [gen] = [e for e in trace.events if e.kind == "generation"]
    assert "- Write each step on its own line." in gen.messages[-1].content
    assert trace.attempt is not None and trace.task.question == question
