"""The sample -> verify -> build -> train -> evaluate loop (after RAFT / RLoop, and PMD).

Each round:

1. **sample**: run the sampler (default ``sc(pot, n=4)``: programs the sandbox
   runs, so there are verified attempts to learn from) with the current weights
   on ``train_size`` problems of the *train* split
   (:func:`refinery.eval.runner.run_eval`, so traces, results and config are kept
   and a rerun resumes);
2. **remember and teach** (``pmd=True`` only): the round's procedural memory is
   built from those attempts (:func:`refinery.distill.memory.build_memory`:
   trajectories, lessons checked by re-solving, patterns; ``round-R/memory``,
   carrying earlier rounds' lessons), and the self-teacher solves the train
   problems again as ``memory(sampler, store=round-R/memory)``: the training
   targets are written with the memory in the prompt, the rows' prompts are the
   questions as asked (the student learns without it);
3. **verify + build**: :func:`refinery.distill.dataset.build` (gold used for
   verification only; ``prompt_filter`` = RAFT or Reinforce-Rej; a verified
   program becomes the worked solution it computes, ``program_rows``);
4. **train**: :func:`refinery.distill.train.train`, LoRA from the current weights, merged
   into ``round-R/model`` (in a child process: its memory and threads go away
   with it, and a crash cannot take the loop down);
5. **evaluate**: plain ``cot`` (no scaffold), greedy, and the sampler itself, on
   ``eval_size`` problems of the held-out *test* split, before (round 0 = the
   base) and after;
6. the next round starts from the new weights.

The two splits never share a problem (``arith`` assigns a problem to a split
by a hash of its text; the loop checks the prompts anyway). Each round's
accuracy and data size go into a table, printed and written to
``OUT/loop.md`` and ``OUT/loop.json`` after every round.

Engines: one vLLM engine per set of weights, closed before training starts
(a caller may pass the engine of the base model; it is then left open).

Example:
    >>> report = await loop("arith", strategy="sc(pot, n=4)", rounds=2,  # doctest: +SKIP
    ...                     train_size=200, eval_size=200, out="runs/distill-arith")
    >>> print(report.markdown())  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from refinery.distill.dataset import BuildStats, build, gold_sft_rows
from refinery.distill.loop_report import (
    DEFAULT_SAMPLER,
    LoopConfig,
    LoopReport,
    RoundReport,
    write_report,
)
from refinery.distill.memory import MemoryStats, build_memory
from refinery.distill.schema import DistillError, read_rows
from refinery.distill.train import TRAIN_RECORD, TrainConfig, TrainResult, read_train_record
from refinery.engine.backends.base import Backend
from refinery.engine.backends.factory import BackendKind, BackendSpec, make_backend
from refinery.eval.datasets import load_dataset
from refinery.eval.example import Example
from refinery.eval.metrics import Accuracy
from refinery.eval.runner import EvalConfig, RunSummary, run_eval
from refinery.strategies.cot import INSTRUCTION as COT_INSTRUCTION
from refinery.strategies.memory_store import MemoryStore

REPO = Path(__file__).resolve().parent.parent

__all__ = ["EngineStarter", "EvalRunner", "Trainer", "loop", "open_engine", "run_loop",
           "train_weights"]

EngineStarter = Callable[[str], Awaitable[Backend]]
"""Starts an engine serving a model (a name or a checkpoint directory)."""
Trainer = Callable[[TrainConfig, Path, bool], Awaitable[TrainResult]]
"""Trains one round's weights: the config, the round's directory, whether in a child process."""
EvalRunner = Callable[..., Awaitable[RunSummary]]
"""Runs one evaluation, called as :func:`~refinery.eval.runner.run_eval` is:
``(config, backend=, examples=, progress=)``."""


async def open_engine(model: str) -> Backend:
    """The loop's engine for ``model``: in-process vLLM."""
    return await make_backend(BackendSpec(model))


async def train_weights(cfg: TrainConfig, workdir: Path, isolate: bool) -> TrainResult:
    """Train as ``cfg`` says, in a child process if ``isolate`` (its config written to
    ``workdir``); a round whose training already finished is read back, not redone."""
    model_dir = Path(cfg.out)
    if (model_dir / TRAIN_RECORD).is_file():  # a rerun of a round that finished training
        return read_train_record(model_dir)
    if not isolate:
        from refinery.distill.train import train

        opts = cfg.model_dump(exclude={"sft_path", "base", "out", "pairs_path"})
        return await asyncio.to_thread(train, cfg.sft_path, cfg.base, cfg.out, cfg.pairs_path,
                                       **opts)
    cfg_path = workdir / "train_config.json"
    cfg_path.write_text(cfg.model_dump_json(indent=2) + "\n")
    # The child must import this checkout even when it is not installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    # `-c`, not `-m refinery.distill.train`: the package __init__ imports
    # refinery.distill.train, and runpy warns when the module it runs is already imported.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from refinery.distill.train import main; "
        "sys.exit(main(sys.argv[1:]))", str(cfg_path), env=env)
    rc = await proc.wait()
    if rc != 0:
        raise DistillError(f"training failed (exit status {rc}); its output is above; "
                           f"config in {cfg_path}")
    return read_train_record(model_dir)


def _prepare(config: LoopConfig) -> tuple[Path, list[Example], list[Example]]:
    """The loop directory, and the train and held-out problems (checked disjoint)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "loop_config.json").write_text(config.model_dump_json(indent=2) + "\n")
    train_ex = load_dataset(config.dataset, split="train", limit=config.train_size,
                            seed=config.seed, levels=config.levels)
    test_ex = load_dataset(config.dataset, split="test", limit=config.eval_size,
                           seed=config.seed, levels=config.levels)
    if not train_ex or not test_ex:
        raise DistillError(f"{config.dataset}: empty train or test split")
    shared = {" ".join(e.prompt.split()) for e in train_ex} & {
        " ".join(e.prompt.split()) for e in test_ex}
    if shared:
        raise DistillError(f"{len(shared)} problem(s) are in both the train and the test split")
    return out, train_ex, test_ex


class _Engine:
    """The engine of the weights in use: the caller's (never closed here) or our own.

    An own engine is closed before training (its memory and cores go to the
    trainer) and before sampling on Ray (the actors start their own).
    """

    def __init__(self, backend: Backend | None, model: str, start: EngineStarter) -> None:
        self.backend, self.model, self.owned = backend, model, False
        self.start = start

    async def open(self, model: str) -> Backend:
        """An engine serving ``model``: the one open if it does, else a new one."""
        if self.backend is None or self.model != model:
            await self.close()
            self.backend, self.model, self.owned = await self.start(model), model, True
        return self.backend

    async def close(self) -> None:
        if self.owned and self.backend is not None:
            closing, self.backend, self.owned = self.backend, None, False
            await closing.aclose()
            # vLLM's AsyncLLM.__del__ shuts down again; run at interpreter exit it raises
            # "'NoneType' object is not callable". Collect the engine now instead.
            del closing
            gc.collect()


@dataclass
class _Round:
    """What one round's steps share: its number, directory and starting weights, and
    what evaluates and trains."""

    config: LoopConfig
    number: int
    dir: Path
    model: str
    progress: bool
    log: Callable[[str], None]
    run_eval: EvalRunner
    train: Trainer

    def eval_config(self, split: str, out: Path, model: str | None = None,
                    strategy: str | None = None) -> EvalConfig:
        """Sampling on the train split, or the held-out evaluation of ``model``."""
        c, train = self.config, split == "train"
        return EvalConfig(
            dataset=c.dataset, strategy=strategy or (c.strategy if train else c.eval_strategy),
            out=str(out), model=model or self.model, split=split,
            limit=c.train_size if train else c.eval_size, seed=c.seed, levels=c.levels,
            temperature=c.sample_temperature if train else c.eval_temperature,
            max_tokens=c.max_tokens, concurrency=c.concurrency, ray=c.ray if train else None)


async def _sample(rnd: _Round, engine: _Engine, train_ex: list[Example], out: Path,
                  strategy: str | None = None) -> RunSummary:
    """The sampling strategy (or ``strategy``) on the train problems, into ``out``."""
    if rnd.config.ray is not None:
        await engine.close()
    be = None if rnd.config.ray else await engine.open(rnd.model)
    return await rnd.run_eval(rnd.eval_config("train", out, strategy=strategy), backend=be,
                              examples=train_ex, progress=rnd.progress)


async def _evaluate(rnd: _Round, engine: _Engine, test_ex: list[Example], model: str,
                    out: Path) -> tuple[Accuracy, Accuracy | None]:
    """Held-out accuracy of ``model``: the evaluation strategy, and the sampler if asked."""
    c, be = rnd.config, await engine.open(model)
    plain = (await rnd.run_eval(rnd.eval_config("test", out / "eval", model), backend=be,
                                examples=test_ex, progress=rnd.progress)).accuracy
    if not c.eval_sampler or c.strategy == c.eval_strategy:
        return plain, None
    cfg = rnd.eval_config("test", out / "eval-sampler", model, strategy=c.strategy)
    return plain, (await rnd.run_eval(cfg, backend=be, examples=test_ex,
                                      progress=rnd.progress)).accuracy


def _build_data(rnd: _Round, train_ex: list[Example], instruction: str | None,
                run: Path) -> tuple[BuildStats, int]:
    """Verified rows of ``run`` (topped up with gold solutions if asked); the gold count."""
    c, rd = rnd.config, rnd.dir
    sft_p, pairs_p = rd / "sft.jsonl", rd / "pairs.jsonl"
    rules = {"instruction": instruction, "prompt_filter": c.prompt_filter,
             "program_rows": c.program_rows}
    stats = build([run], sft_p, pairs_p, **rules)
    gold_rows = 0
    if stats.sft_rows < c.gold_fallback_rows:
        covered = ({r.metadata.problem_id for r in read_rows(sft_p, "sft")}
                   if stats.sft_rows else set())
        extra = gold_sft_rows([e for e in train_ex if e.id not in covered],
                              instruction=instruction)[:c.gold_fallback_rows - stats.sft_rows]
        gold_rows = len(extra)
        stats = build([run], sft_p, pairs_p, extra_sft=extra, **rules)
        rnd.log(f"round {rnd.number}: only {stats.sft_rows - gold_rows} verified rows; added "
                f"{gold_rows} gold-solution rows (gold_fallback_rows={c.gold_fallback_rows})")
    (rd / "build_stats.json").write_text(stats.model_dump_json(indent=2) + "\n")
    rnd.log(f"round {rnd.number}: {stats.sft_rows} SFT rows (weighted "
            f"{stats.weighted_sft_rows:g}) from {stats.problems_with_sft}/{stats.problems} "
            f"problems, {stats.pairs} pairs; rescued {stats.rescued}, easy {stats.easy}; "
            f"dropped {stats.dropped}")
    if stats.sft_rows == 0:
        raise DistillError(
            f"round {rnd.number}: no verified SFT rows (the sampler solved nothing usable); "
            "try more samples (e.g. sc(cot, n=8)), more train problems, or gold_fallback_rows")
    return stats, gold_rows


async def _train_round(rnd: _Round, stats: BuildStats) -> TrainResult:
    """LoRA from the round's weights, merged into ``round-R/model``."""
    c, rd = rnd.config, rnd.dir
    pairs_p = rd / "pairs.jsonl"
    tcfg = TrainConfig.model_validate({
        "batch_size": 8, "max_length": 512, **c.train,
        "sft_path": str(rd / "sft.jsonl"), "out": str(rd / "model"), "base": rnd.model,
        "pairs_path": str(pairs_p) if c.pairs and stats.pairs else None,
        "progress": rnd.progress})
    return await rnd.train(tcfg, rd, c.isolate_training)


async def _teacher(rnd: _Round, engine: _Engine, train_ex: list[Example],
                   teacher: Backend | None) -> MemoryStats:
    """PMD: the round's memory from its attempts, then the self-teacher solves the train
    problems with that memory in the prompt (``round-R/teacher``: the training targets;
    the rows' prompts are the questions as asked, without the memory)."""
    c, rd = rnd.config, rnd.dir
    prev_dir = rd.parent / f"round-{rnd.number - 1}" / "memory"
    previous = MemoryStore.load(prev_dir) if prev_dir.is_dir() else None
    stats = await build_memory([rd / "sample"], rd / "memory", await engine.open(rnd.model),
                               round=rnd.number, previous=previous, teacher=teacher,
                               teacher_name=c.teacher_model or "teacher",
                               max_lessons=c.max_lessons, max_tokens=c.max_tokens)
    (rd / "memory_stats.json").write_text(stats.model_dump_json(indent=2) + "\n")
    rnd.log(f"round {rnd.number}: memory: {stats.lessons_kept}/{stats.lessons_written} lessons "
            f"kept ({stats.mixed_problems} problems with a passing and a failing attempt), "
            f"{stats.patterns} patterns")
    store = json.dumps(str((rd / "memory").resolve()))
    await _sample(rnd, engine, train_ex, rd / "teacher",
                  strategy=f"memory({c.strategy}, store={store})")
    return stats


async def _run_round(rnd: _Round, engine: _Engine, train_ex: list[Example],
                     test_ex: list[Example], before: tuple[Accuracy, Accuracy | None],
                     teacher: Backend | None) -> RoundReport:
    """Sample, (PMD: remember, teach), build, train, evaluate: one round, timed step by step."""
    c, secs, rd = rnd.config, {}, rnd.dir
    instruction = COT_INSTRUCTION if c.match_eval_prompt and c.eval_strategy == "cot" else None
    t = time.monotonic()
    sample = await _sample(rnd, engine, train_ex, rd / "sample")
    secs["sample"] = time.monotonic() - t
    rnd.log(f"round {rnd.number}: {c.strategy} on {sample.total} train problems: "
            f"accuracy {sample.accuracy} [{secs['sample']:.0f}s]")
    memory = None
    if c.pmd:
        t = time.monotonic()
        memory = await _teacher(rnd, engine, train_ex, teacher)
        secs["memory"] = time.monotonic() - t
    await engine.close()  # free the engine's memory and cores for training
    t = time.monotonic()
    stats, gold_rows = _build_data(rnd, train_ex, instruction,
                                   rd / ("teacher" if c.pmd else "sample"))
    secs["build"] = time.monotonic() - t
    t = time.monotonic()
    result = await _train_round(rnd, stats)
    secs["train"] = time.monotonic() - t
    rnd.log(f"round {rnd.number}: trained {result.sft.steps} steps on "
            f"{result.sft.expanded_rows} rows: loss {result.eval_loss_before} -> "
            f"{result.eval_loss_after} [{secs['train']:.0f}s]")
    new_model = str((rd / "model").resolve())
    t = time.monotonic()
    after = await _evaluate(rnd, engine, test_ex, new_model, rd)
    secs["eval"] = time.monotonic() - t
    return RoundReport(
        round=rnd.number, model_in=rnd.model, model_out=new_model,
        train_problems=len(train_ex), sample_accuracy=sample.accuracy,
        sample_tokens_per_problem=sample.cost.tokens, build=stats, gold_rows=gold_rows,
        train_steps=result.sft.steps, loss_before=result.eval_loss_before,
        loss_after=result.eval_loss_after, dpo_steps=result.dpo.steps if result.dpo else 0,
        accuracy_before=before[0], accuracy_after=after[0], sampler_before=before[1],
        sampler_after=after[1], memory=memory, seconds={k: round(v, 1) for k, v in secs.items()})


async def _teacher_backend(config: LoopConfig) -> Backend | None:
    if config.teacher_url is None:
        return None
    return await make_backend(BackendSpec(config.teacher_model or config.base,
                                          kind=BackendKind.openai,
                                          base_url=(config.teacher_url,)))


async def run_loop(config: LoopConfig, *, backend: Backend | None = None,
                   progress: bool = True, log: Callable[[str], None] = print,
                   start_engine: EngineStarter = open_engine, trainer: Trainer = train_weights,
                   eval_runner: EvalRunner = run_eval) -> LoopReport:
    """Run ``config.rounds`` rounds; see the module docstring.

    ``backend`` may be an engine already serving ``config.base`` (it is used for
    the first round's sampling and baseline, and never closed here). The loop
    starts its other engines with ``start_engine``, trains with ``trainer`` and
    samples and evaluates with ``eval_runner`` (tests pass stand-ins).

    Raises:
        DatasetError, SpecError: bad dataset or strategy (before any model work).
        DistillError: overlapping splits, no training data, failed training.
    """
    out, train_ex, test_ex = _prepare(config)
    report = LoopReport(config=config, eval_problems=len(test_ex))
    model, engine = config.base, _Engine(backend, config.base, start_engine)
    teacher = await _teacher_backend(config)
    try:
        t = time.monotonic()
        base = _Round(config, 0, out / "round-0", model, progress, log, eval_runner, trainer)
        before = await _evaluate(base, engine, test_ex, model, out / "round-0")
        log(f"round 0 ({model}): held-out {config.eval_strategy} accuracy {before[0]}"
            f"{f', sampler {before[1]}' if before[1] else ''} [{time.monotonic() - t:.0f}s]")
        for number in range(1, config.rounds + 1):
            rnd = replace(base, number=number, dir=out / f"round-{number}", model=model)
            rnd.dir.mkdir(exist_ok=True)
            report.rounds.append(await _run_round(rnd, engine, train_ex, test_ex, before,
                                                  teacher))
            write_report(report, out)
            log(report.markdown())
            last = report.rounds[-1]
            model, before = last.model_out, (last.accuracy_after, last.sampler_after)
    finally:
        await engine.close()
        if teacher is not None:
            await teacher.aclose()
    return report


async def loop(dataset: str = "arith", strategy: str = DEFAULT_SAMPLER, rounds: int = 1,
               train_size: int = 200, eval_size: int = 100, *,
               backend: Backend | None = None, progress: bool = True,
               log: Callable[[str], None] = print, **options: Any) -> LoopReport:
    """Run the loop with keyword settings (the other :class:`LoopConfig` fields in ``options``).

    Example:
        >>> report = await loop("arith", "sc(pot, n=4)", rounds=2,  # doctest: +SKIP
        ...                     out="runs/d", train={"max_steps": 16})
        >>> [r.accuracy_after.value for r in report.rounds]  # doctest: +SKIP
    """
    config = LoopConfig(dataset=dataset, strategy=strategy, rounds=rounds,
                        train_size=train_size, eval_size=eval_size, **options)
    return await run_loop(config, backend=backend, progress=progress, log=log)

