"""Real runner traces (scripted model) -> build, and the loop's plumbing with a fake trainer."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from refinery.distill.dataset import build
from refinery.distill.loop import EvalRunner, run_loop
from refinery.distill.loop_report import LoopConfig, LoopReport, read_report
from refinery.distill.schema import DistillError, read_rows
from refinery.distill.train import StageResult, TrainConfig, TrainResult
from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.arith import load_arith
from refinery.eval.runner import EvalConfig, run_eval
from refinery.strategies.cot import INSTRUCTION
from refinery.strategies.memory_store import MemoryStore
from tests.scripted_backend import ScriptedBackend

N = 10
GOLD = {e.prompt: (e.gold, e.level) for s in ("train", "test") for e in load_arith(s, limit=N)}


def _question(text: str) -> str:
    return text.split("\n\n")[0].strip()


def critique_refine_model() -> ScriptedBackend:
    """Level-1 drafts are right, the others off by one; every refinement is right.
    The critic grades by whether the solution's answer is right."""

    def critique(messages, params, i) -> str:
        m = re.search(r"Problem:\n(.*?)\n\nSolution:\n(.*?)\n\nFirst say", messages[-1].content,
                      re.S)
        gold, _ = GOLD[m.group(1).strip()]
        ok = f"\\boxed{{{gold}}}" in m.group(2)
        g = 4 if ok else 1
        return (f"Correctness: {g} - r\nCompleteness: {g} - r\nReasoning validity: {g} - r\n"
                f"Format: {g} - r\nSummary: s.\nDirective: recompute the last step.")

    def refine(messages, params, i) -> str:
        gold, _ = GOLD[_question(messages[0].content)]
        return f"Recomputing every step carefully gives {gold}. The answer is \\boxed{{{gold}}}."

    def draft(messages, params, i) -> str:
        gold, level = GOLD[_question(messages[-1].content)]
        ans = gold if level == 1 else int(gold) + 1
        return f"Working it out step by step, the result is {ans}. \\boxed{{{ans}}}"

    return ScriptedBackend([(r"strict examiner", critique), (r"A reviewer checked", refine),
                            (r".*", draft)])


async def test_critique_refine_run_gives_rescued_rows_and_edge_pairs(tmp_path) -> None:
    out = tmp_path / "run"
    cfg = EvalConfig(dataset="arith", strategy="critique_refine(cot, rounds=1)", limit=N,
                     out=str(out), model="scripted", split="train", temperature=0.0)
    summary = await run_eval(cfg, backend=critique_refine_model(), progress=False)
    assert summary.accuracy.correct == N  # every final attempt is right
    stats = build([out], tmp_path / "sft.jsonl", tmp_path / "pairs.jsonl")
    n_easy = sum(1 for e in load_arith("train", limit=N) if e.level == 1)
    assert (stats.easy, stats.rescued) == (n_easy, N - n_easy)
    sft = read_rows(tmp_path / "sft.jsonl", "sft")
    pairs = read_rows(tmp_path / "pairs.jsonl", "pair")
    assert len(sft) == N  # rescued: the one refinement; easy: the one draft
    for row in sft:
        md = row.metadata
        if md.rescued:
            assert (md.weight, md.step, md.iteration) == (2.0, "refine", 1)
            assert row.messages[-1].content.startswith("Recomputing")
        else:
            assert (md.weight, md.step, md.easy) == (0.5, "draft", True)
        assert md.run_strategy.startswith("critique_refine") and md.model == "scripted"
    assert len(pairs) == N - n_easy
    for p in pairs:
        assert p.metadata.pair_source == "refinement_edge"
        assert p.metadata.rejected_step == "draft"
        assert p.rejected[0].content.startswith("Working it out")
        assert p.chosen[0].content.startswith("Recomputing")


# ----------------------------------------------------------------------------- the loop


def sc_model(right_share: int) -> ScriptedBackend:
    """Of every 4 samples, ``right_share`` are right."""

    def reply(messages, params, i) -> str:
        gold, _ = GOLD[_question(messages[-1].content)]
        ans = gold if i % 4 < right_share else int(gold) + 7
        return f"Sample {i}: so it is {ans}. The answer is \\boxed{{{ans}}}."

    return ScriptedBackend([(r".*", reply)])


@dataclass
class FakeParts:
    """Stand-ins for the loop's engines and trainer: engines are scripted models (made by
    ``model``); training writes a stub checkpoint and a record. ``started`` and ``trained``
    say what the loop asked for."""

    model: Callable[[], ScriptedBackend] = lambda: sc_model(2)
    started: list[str] = field(default_factory=list)
    engines: list[ScriptedBackend] = field(default_factory=list)
    trained: list[TrainConfig] = field(default_factory=list)

    async def start(self, model: str) -> ScriptedBackend:
        self.started.append(model)
        self.engines.append(self.model())
        return self.engines[-1]

    async def train(self, cfg: TrainConfig, workdir: Path, isolate: bool) -> TrainResult:
        self.trained.append(cfg)
        os.makedirs(cfg.out)
        rows = read_rows(cfg.sft_path, "sft")
        stage = StageResult(rows=len(rows), expanded_rows=len(rows), steps=2, losses=[2.0, 1.5])
        return TrainResult(out=cfg.out, base=cfg.base, base_dir=cfg.base, config=cfg, sft=stage,
                           eval_loss_before=2.0, eval_loss_after=1.5)

    async def run(self, out: Path, *, rounds: int = 1, eval_size: int = N,
                  log: Callable[[str], None] = lambda s: None,
                  backend: ScriptedBackend | None = None, eval_runner: EvalRunner = run_eval,
                  **settings: Any) -> LoopReport:
        """The loop on arith with ``sc(cot, n=4)`` on these stand-ins; ``settings`` are
        the other :class:`LoopConfig` fields."""
        config = LoopConfig(dataset="arith", strategy="sc(cot, n=4)", rounds=rounds,
                            train_size=N, eval_size=eval_size, out=str(out), **settings)
        return await run_loop(config, backend=backend, progress=False, log=log,
                              start_engine=self.start, trainer=self.train,
                              eval_runner=eval_runner)


async def test_loop_chains_rounds_and_writes_the_table(tmp_path) -> None:
    parts = FakeParts()
    started, trained = parts.started, parts.trained
    out = tmp_path / "loop"
    lines: list[str] = []
    report = await parts.run(out, rounds=2, log=lines.append, train={"max_steps": 2})
    assert len(report.rounds) == 2
    r1, r2 = report.rounds
    # Each round trains from the previous round's weights and evaluates the new ones.
    assert started[0] == DEFAULT_MODEL and started[1] == r1.model_out
    assert trained[0].base == DEFAULT_MODEL and trained[1].base == r1.model_out
    assert trained[0].max_steps == 2 and r2.model_in == r1.model_out
    cfg = json.loads((out / "round-2" / "sample" / "config.json").read_text())
    assert cfg["model"] == r1.model_out and cfg["dataset"]["split"] == "train"
    ev = json.loads((out / "round-1" / "eval" / "config.json").read_text())
    assert ev["dataset"]["split"] == "test" and ev["strategy"]["canonical"] == "cot"
    assert ev["sampling"]["temperature"] == 0.0
    # Held-out problems and sampled problems never overlap.
    sample_ids = {json.loads(x)["prompt"] for x in
                  (out / "round-1" / "sample" / "results.jsonl").read_text().splitlines()}
    eval_ids = {json.loads(x)["prompt"] for x in
                (out / "round-1" / "eval" / "results.jsonl").read_text().splitlines()}
    assert len(sample_ids) == N and len(eval_ids) == N and not sample_ids & eval_ids
    # 2 right + 2 wrong samples per problem: 2 SFT rows, and 2 x 2 = 4 pairs (the cap).
    assert r1.build.sft_rows == 2 * N and r1.build.pairs == 4 * N
    assert r1.sample_accuracy.n == N and r1.accuracy_before.n == N
    rows = read_rows(out / "round-1" / "sft.jsonl", "sft")
    assert rows[0].messages[0].content.endswith(INSTRUCTION)  # prompts match cot eval
    # Without pmd the rows are the sampler's own and no memory is kept.
    assert {r.metadata.source_run for r in rows} == {str(out / "round-1" / "sample")}
    assert r1.memory is None and not (out / "round-1" / "memory").exists()
    # The table: printed and written, one line per round.
    md = (out / "loop.md").read_text()
    assert md.count("\n| 1 |") == 1 and md.count("\n| 2 |") == 1
    assert "2.000 -> 1.500" in md and any("| 2 |" in x for x in lines)
    assert read_report(out / "loop.json").rounds[1].round == 2


async def test_loop_gold_fallback_fills_rows_when_the_model_fails(tmp_path) -> None:
    parts = FakeParts(model=lambda: sc_model(0))  # never right
    with pytest.raises(DistillError, match="no verified SFT rows"):
        await parts.run(tmp_path / "a", eval_size=4)
    report = await parts.run(tmp_path / "b", eval_size=4, gold_fallback_rows=6)
    [r] = report.rounds
    assert r.gold_rows == 6 and r.build.sft_rows == 6
    rows = read_rows(tmp_path / "b" / "round-1" / "sft.jsonl", "sft")
    assert {x.metadata.verifier for x in rows} == {"gold"}


async def test_loop_uses_the_callers_engine_for_the_base_and_leaves_it_open(tmp_path) -> None:
    parts = FakeParts()
    started = parts.started
    given = sc_model(2)
    report = await parts.run(tmp_path / "loop", backend=given)
    [r1] = report.rounds
    # The base model's baseline and sampling ran on the caller's engine; only the
    # trained weights got an engine of their own, and the caller's stays open.
    assert started == [r1.model_out]
    assert len(given.calls) > 0 and not given.closed
    assert r1.accuracy_before.n == N and r1.sample_accuracy.n == N


async def test_loop_on_ray_closes_its_engine_before_sampling(tmp_path) -> None:
    from refinery.eval.ray_pool import RayOptions

    parts = FakeParts()
    engines = parts.engines
    seen: list[tuple[bool, bool, bool]] = []  # (on ray, backend given, every engine closed)

    async def fake_run_eval(config: EvalConfig, *, backend, examples, progress):
        seen.append((config.ray is not None, backend is not None,
                     all(e.closed for e in engines)))
        if config.ray is not None:  # stands in for the actors: a backend of their own
            config, backend = config.model_copy(update={"ray": None}), sc_model(2)
        return await run_eval(config, backend=backend, examples=examples, progress=progress)

    await parts.run(tmp_path / "loop", eval_runner=fake_run_eval, ray=RayOptions(replicas=2),
                    eval_sampler=False)
    # Baseline on the base engine; sampling on "Ray" with that engine closed and none
    # passed; the trained weights' evaluation on a new engine, closed at the end.
    assert seen == [(False, True, False), (True, False, True), (False, True, False)]
    assert len(engines) == 2 and all(e.closed for e in engines)


def pmd_model() -> ScriptedBackend:
    """sc_model(2), and a one-line lesson when asked for one."""
    solve = sc_model(2).rules[0][1]

    def reply(messages, params, i) -> str:
        if "state the general rule" in messages[-1].content:
            return "Apply each change to the running total in order."
        return solve(messages, params, i)

    return ScriptedBackend([(r".*", reply)])


async def test_a_pmd_round_remembers_then_trains_on_the_teachers_run(tmp_path) -> None:
    parts = FakeParts(model=pmd_model)
    trained = parts.trained
    out = tmp_path / "loop"
    report = await parts.run(out, rounds=2, pmd=True)
    r1, r2 = report.rounds
    stores = [MemoryStore.load(out / f"round-{k}" / "memory") for k in (1, 2)]
    # Round 2's store carries round 1's trajectories forward.
    assert r1.memory.trajectories == len(stores[0].trajectories) == N * 4
    assert len(stores[1].trajectories) == 2 * N * 4 and r2.memory.trajectories == N * 4
    teacher = json.loads((out / "round-1" / "teacher" / "config.json").read_text())
    store = repr(str((out / "round-1" / "memory").resolve()))
    assert teacher["strategy"]["canonical"] == f"memory(sc(cot, n=4), store={store})"
    rows = read_rows(trained[0].sft_path, "sft")
    assert rows and {r.metadata.source_run for r in rows} == {str(out / "round-1" / "teacher")}
    # The sampler is evaluated beside plain cot, before and after.
    assert r1.sampler_before is not None and r1.sampler_after is not None
    assert r2.sampler_before == r1.sampler_after
    assert "lessons kept / written" in (out / "loop.md").read_text()
