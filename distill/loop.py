"""The sample -> verify -> build -> train -> evaluate loop (after RAFT / RLoop).

Each round:

1. **sample**: run the sampling strategy (e.g. ``sc(cot, n=4)``: n samples per
   problem, so there are correct and incorrect ones to learn from) with the
   current weights on ``train_size`` problems of the *train* split
   (:func:`refinery.eval.runner.run_eval`, so traces, results and config are kept and a
   rerun resumes);
2. **verify + build**: :func:`refinery.distill.dataset.build` (gold used for verification only);
3. **train**: :func:`refinery.distill.train.train`, LoRA from the current weights, merged
   into ``round-R/model`` (in a child process: its memory and threads go away
   with it, and a crash cannot take the loop down);
4. **evaluate**: plain ``cot`` (no scaffold), greedy, on ``eval_size`` problems of
   the held-out *test* split, before (round 0 = the base) and after;
5. the next round starts from the new weights.

The two splits never share a problem (``arith`` assigns a problem to a split
by a hash of its text; the loop checks the prompts anyway). Each round's
accuracy and data size go into a table, printed and written to
``OUT/loop.md`` and ``OUT/loop.json`` after every round.

Engines: one vLLM engine per set of weights, closed before training starts
(a caller may pass the engine of the base model; it is then left open).

Example:
    >>> report = await loop("arith", strategy="sc(cot, n=4)", rounds=1, train_size=200,
    ...                     eval_size=100, out="runs/distill-arith")
    >>> print(report.markdown())
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from refinery.distill.dataset import BuildStats, build, gold_sft_rows
from refinery.distill.schema import DistillError, read_rows
from refinery.distill.train import TRAIN_RECORD, TrainConfig, TrainResult, read_train_record
from refinery.engine.backends.base import Backend
from refinery.engine.backends.factory import BackendSpec, make_backend
from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.datasets import Example, load_dataset
from refinery.eval.metrics import Accuracy
from refinery.eval.ray_pool import RayOptions
from refinery.eval.runner import EvalConfig, RunSummary, run_eval
from refinery.strategies.cot import INSTRUCTION as COT_INSTRUCTION

REPO = Path(__file__).resolve().parent.parent

__all__ = ["LoopConfig", "LoopReport", "RoundReport", "loop", "read_report", "run_loop"]


class LoopConfig(BaseModel):
    """Settings of a distillation loop.

    ``train`` holds :class:`~refinery.distill.train.TrainConfig` overrides (``max_steps``,
    ``batch_size``, ``learning_rate``, ...). ``gold_fallback_rows``: when the
    model's own verified data has fewer SFT rows than this, reference solutions
    of unsolved train problems fill the gap (``arith`` only; rows are marked
    ``verifier="gold"``); 0 = never, the default.

    Example:
        >>> LoopConfig(out="runs/d").strategy
        'sc(cot, n=4)'
    """

    dataset: str = "arith"
    strategy: str = "sc(cot, n=4)"
    rounds: int = Field(1, ge=1)
    train_size: int = Field(200, ge=1)
    eval_size: int = Field(100, ge=1)
    base: str = DEFAULT_MODEL
    out: str = "runs/distill"
    eval_strategy: str = "cot"
    sample_temperature: float = Field(0.7, ge=0.0, le=2.0)
    eval_temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(384, ge=1)
    concurrency: int = Field(64, ge=1)
    seed: int = 0
    levels: list[int] | None = None
    match_eval_prompt: bool = Field(
        True, description="append cot's instruction to training prompts, as evaluation does")
    pairs: bool = Field(False, description="also train DPO on preference pairs")
    gold_fallback_rows: int = Field(0, ge=0)
    train: dict[str, Any] = Field(default_factory=dict)
    isolate_training: bool = True
    ray: RayOptions | None = Field(None, description="sample on Ray actors (the train split "
                                   "and the round's weights must be readable on every node)")


class RoundReport(BaseModel):
    """One round: data made, training, and held-out accuracy before/after.

    Example:
        >>> r = read_report("runs/distill/loop.json").rounds[0]
        >>> r.build.sft_rows, str(r.accuracy_before), str(r.accuracy_after)
        (29, '3.0% (1.0-8.5)', '2.0% (0.6-7.0)')
    """

    round: int
    model_in: str
    model_out: str
    train_problems: int
    sample_accuracy: Accuracy
    sample_tokens_per_problem: float
    build: BuildStats
    gold_rows: int = 0
    train_steps: int = 0
    loss_before: float | None = None
    loss_after: float | None = None
    dpo_steps: int = 0
    accuracy_before: Accuracy
    accuracy_after: Accuracy
    seconds: dict[str, float] = Field(default_factory=dict)

    @property
    def delta(self) -> float:
        return self.accuracy_after.value - self.accuracy_before.value


class LoopReport(BaseModel):
    """Every round of a loop, renderable as a markdown table.

    Example:
        >>> print(read_report("runs/distill/loop.json").markdown())
    """

    config: LoopConfig
    eval_problems: int
    rounds: list[RoundReport] = Field(default_factory=list)

    def markdown(self) -> str:
        c = self.config
        lines = [
            f"Distillation loop on `{c.dataset}`: sample with `{c.strategy}` "
            f"(T={c.sample_temperature}) on {c.train_size} train problems, evaluate plain "
            f"`{c.eval_strategy}` (T={c.eval_temperature}) on {self.eval_problems} held-out "
            "test problems.",
            "",
            "| round | sampler acc (train) | SFT rows (weighted) | pairs | gold rows | "
            "rescued / easy | steps | loss before -> after | held-out acc before | "
            "held-out acc after | Δ | minutes |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rounds:
            b = r.build
            loss = (f"{r.loss_before:.3f} -> {r.loss_after:.3f}"
                    if r.loss_before is not None and r.loss_after is not None else "-")
            lines.append(
                f"| {r.round} | {r.sample_accuracy} | {b.sft_rows} ({b.weighted_sft_rows:g}) | "
                f"{b.pairs} | {r.gold_rows} | {b.rescued} / {b.easy} | {r.train_steps} | "
                f"{loss} | {r.accuracy_before} | {r.accuracy_after} | "
                f"{100 * r.delta:+.1f} pts | {sum(r.seconds.values()) / 60:.1f} |")
        return "\n".join(lines) + "\n"


def _write_report(report: LoopReport, out: Path) -> None:
    for name, body in (("loop.json", report.model_dump_json(indent=2) + "\n"),
                       ("loop.md", report.markdown())):
        tmp = out / f".{name}.tmp"
        tmp.write_text(body, encoding="utf-8")
        os.replace(tmp, out / name)


async def _start(model: str) -> Backend:
    return await make_backend(BackendSpec(model))


async def _train(cfg: TrainConfig, workdir: Path, isolate: bool) -> TrainResult:
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

    def __init__(self, backend: Backend | None, model: str) -> None:
        self.backend, self.model, self.owned = backend, model, False

    async def open(self, model: str) -> Backend:
        """An engine serving ``model``: the one open if it does, else a new one."""
        if self.backend is None or self.model != model:
            await self.close()
            self.backend, self.model, self.owned = await _start(model), model, True
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
    """What one round's steps share: its number, directory and starting weights."""

    config: LoopConfig
    number: int
    dir: Path
    model: str
    progress: bool
    log: Callable[[str], None]

    def eval_config(self, split: str, out: Path, model: str | None = None) -> EvalConfig:
        """Sampling on the train split, or the held-out evaluation of ``model``."""
        c, train = self.config, split == "train"
        return EvalConfig(
            dataset=c.dataset, strategy=c.strategy if train else c.eval_strategy, out=str(out),
            model=model or self.model, split=split,
            limit=c.train_size if train else c.eval_size, seed=c.seed, levels=c.levels,
            temperature=c.sample_temperature if train else c.eval_temperature,
            max_tokens=c.max_tokens, concurrency=c.concurrency, ray=c.ray if train else None)


async def _sample(rnd: _Round, engine: _Engine, train_ex: list[Example]) -> RunSummary:
    """Step 1: the sampling strategy on the train problems, then the engine is closed."""
    if rnd.config.ray is not None:
        await engine.close()
    be = None if rnd.config.ray else await engine.open(rnd.model)
    sample = await run_eval(rnd.eval_config("train", rnd.dir / "sample"), backend=be,
                            examples=train_ex, progress=rnd.progress)
    await engine.close()  # free the engine's memory and cores for training
    return sample


def _build_data(rnd: _Round, train_ex: list[Example],
                instruction: str | None) -> tuple[BuildStats, int]:
    """Step 2: verified rows (topped up with gold solutions if asked); the gold count."""
    c, rd = rnd.config, rnd.dir
    sft_p, pairs_p = rd / "sft.jsonl", rd / "pairs.jsonl"
    stats = build([rd / "sample"], sft_p, pairs_p, instruction=instruction)
    gold_rows = 0
    if stats.sft_rows < c.gold_fallback_rows:
        covered = ({r.metadata.problem_id for r in read_rows(sft_p, "sft")}
                   if stats.sft_rows else set())
        extra = gold_sft_rows([e for e in train_ex if e.id not in covered],
                              instruction=instruction)[:c.gold_fallback_rows - stats.sft_rows]
        gold_rows = len(extra)
        stats = build([rd / "sample"], sft_p, pairs_p, instruction=instruction, extra_sft=extra)
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
    """Step 3: LoRA from the round's weights, merged into ``round-R/model``."""
    c, rd = rnd.config, rnd.dir
    pairs_p = rd / "pairs.jsonl"
    tcfg = TrainConfig.model_validate({
        "batch_size": 8, "max_length": 512, **c.train,
        "sft_path": str(rd / "sft.jsonl"), "out": str(rd / "model"), "base": rnd.model,
        "pairs_path": str(pairs_p) if c.pairs and stats.pairs else None,
        "progress": rnd.progress})
    return await _train(tcfg, rd, c.isolate_training)


async def _run_round(rnd: _Round, engine: _Engine, train_ex: list[Example],
                     test_ex: list[Example], before: Accuracy) -> RoundReport:
    """Sample, build, train, evaluate: one round, timed step by step."""
    c, secs = rnd.config, {}
    instruction = COT_INSTRUCTION if c.match_eval_prompt and c.eval_strategy == "cot" else None
    t = time.monotonic()
    sample = await _sample(rnd, engine, train_ex)
    secs["sample"] = time.monotonic() - t
    rnd.log(f"round {rnd.number}: {c.strategy} on {sample.total} train problems: "
            f"accuracy {sample.accuracy} [{secs['sample']:.0f}s]")
    t = time.monotonic()
    stats, gold_rows = _build_data(rnd, train_ex, instruction)
    secs["build"] = time.monotonic() - t
    t = time.monotonic()
    result = await _train_round(rnd, stats)
    secs["train"] = time.monotonic() - t
    rnd.log(f"round {rnd.number}: trained {result.sft.steps} steps on "
            f"{result.sft.expanded_rows} rows: loss {result.eval_loss_before} -> "
            f"{result.eval_loss_after} [{secs['train']:.0f}s]")
    new_model = str((rnd.dir / "model").resolve())
    t = time.monotonic()
    be = await engine.open(new_model)
    after = (await run_eval(rnd.eval_config("test", rnd.dir / "eval", new_model), backend=be,
                            examples=test_ex, progress=rnd.progress)).accuracy
    secs["eval"] = time.monotonic() - t
    return RoundReport(
        round=rnd.number, model_in=rnd.model, model_out=new_model,
        train_problems=len(train_ex), sample_accuracy=sample.accuracy,
        sample_tokens_per_problem=sample.cost.tokens, build=stats, gold_rows=gold_rows,
        train_steps=result.sft.steps, loss_before=result.eval_loss_before,
        loss_after=result.eval_loss_after, dpo_steps=result.dpo.steps if result.dpo else 0,
        accuracy_before=before, accuracy_after=after,
        seconds={k: round(v, 1) for k, v in secs.items()})


async def run_loop(config: LoopConfig, *, backend: Backend | None = None,
                   progress: bool = True,
                   log: Callable[[str], None] = print) -> LoopReport:
    """Run ``config.rounds`` rounds; see the module docstring.

    ``backend`` may be an engine already serving ``config.base`` (it is used for
    the first round's sampling and baseline, and never closed here).

    Raises:
        DatasetError, SpecError: bad dataset or strategy (before any model work).
        DistillError: overlapping splits, no training data, failed training.
    """
    out, train_ex, test_ex = _prepare(config)
    report = LoopReport(config=config, eval_problems=len(test_ex))
    model, engine = config.base, _Engine(backend, config.base)
    try:
        t = time.monotonic()
        base = _Round(config, 0, out / "round-0", model, progress, log)
        before = (await run_eval(base.eval_config("test", out / "round-0-eval"),
                                 backend=await engine.open(model), examples=test_ex,
                                 progress=progress)).accuracy
        log(f"round 0 ({model}): held-out {config.eval_strategy} accuracy {before} "
            f"[{time.monotonic() - t:.0f}s]")
        for number in range(1, config.rounds + 1):
            rnd = _Round(config, number, out / f"round-{number}", model, progress, log)
            rnd.dir.mkdir(exist_ok=True)
            report.rounds.append(await _run_round(rnd, engine, train_ex, test_ex, before))
            _write_report(report, out)
            log(report.markdown())
            model, before = report.rounds[-1].model_out, report.rounds[-1].accuracy_after
    finally:
        await engine.close()
    return report


async def loop(dataset: str = "arith", strategy: str = "sc(cot, n=4)", rounds: int = 1,
               train_size: int = 200, eval_size: int = 100, *,
               backend: Backend | None = None, progress: bool = True,
               log: Callable[[str], None] = print, **options: Any) -> LoopReport:
    """Run the loop with keyword settings (the other :class:`LoopConfig` fields in ``options``).

    Example:
        >>> report = await loop("arith", "sc(cot, n=4)", rounds=2, out="runs/d",
        ...                     train={"max_steps": 16})
        >>> [r.accuracy_after.value for r in report.rounds]
    """
    config = LoopConfig(dataset=dataset, strategy=strategy, rounds=rounds,
                        train_size=train_size, eval_size=eval_size, **options)
    return await run_loop(config, backend=backend, progress=progress, log=log)


def read_report(path: str | os.PathLike[str]) -> LoopReport:
    """Read a ``loop.json`` back."""
    return LoopReport.model_validate(json.loads(Path(path).read_text()))
