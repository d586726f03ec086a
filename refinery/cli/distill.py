"""``refinery distill``: build training data from runs, fine-tune, run the distillation loop.

``distill train``'s flags are :class:`~refinery.distill.train.TrainConfig`'s
fields and ``distill loop``'s :class:`~refinery.distill.loop.LoopConfig`'s (its
``--ray-*`` flags as ``eval run``'s), names, bounds and defaults included. Bad
input (a missing run or dataset file, an empty dataset, an existing output
model, a bad option) prints one ``error:`` line and exits with status 2.

Example:
    $ refinery distill build --runs runs/sc4-train --sft out/sft.jsonl --pairs out/pairs.jsonl
    $ refinery distill train --sft-path out/sft.jsonl --out models/arith-r1
    $ refinery distill loop --dataset arith --strategy "sc(pot, n=4)" --rounds 2 --pmd
"""

from __future__ import annotations

import asyncio
import os
import typing

import click

from refinery.cli.console import INTERRUPTED, USAGE, fail, missing_extra
from refinery.cli.eval import RAY_HELP
from refinery.cli.flags import config_flags
from refinery.distill import LoopConfig, TrainConfig
from refinery.distill.schema import SFTFormat
from refinery.distill.selection import ProgramRows, PromptFilter
from refinery.engine.errors import RefineryError

__all__ = ["distill_group"]

TRAIN_HELP = {
    "sft_path": "SFT JSONL from `distill build`",
    "out": "directory of the merged checkpoint",
    "base": "the model fine-tuned: registered name, local dir or hub id",
    "pairs_path": "preference JSONL: DPO after SFT",
    "learning_rate": "SFT learning rate",
    "max_length": "tokens per example",
    "save_dtype": "dtype of the saved checkpoint",
    "overwrite": "replace an existing OUT",
    "progress": "show progress bars",
}

LOOP_HELP = RAY_HELP | {
    "dataset": "dataset with train and test splits",
    "train_size": "train-split problems sampled per round",
    "eval_size": "held-out test problems",
    "base": "the starting policy: registered name, local dir or hub id",
    "out": "loop directory (rerun to resume)",
    "eval_strategy": "the strategy the held-out evaluation runs",
    "seed": "dataset generator seed",
    "levels": "arith levels to include (repeatable)",
    "gold_fallback_rows": "top SFT data up to this many rows with reference solutions "
    "(arith)",
    "teacher_model": "the teacher's model name (default: --base)",
    "max_lessons": "problems asked for a lesson per round",
    "train": "a TrainConfig setting of every round's training, e.g. max_steps=16 or "
    "learning_rate=3e-4 (repeatable; `refinery distill train --help` lists them)",
    "isolate_training": "train in a child process (its memory goes back when it ends)",
}


@click.group("distill")
def distill_group() -> None:
    """Traces -> SFT / preference data -> LoRA fine-tuning -> eval."""


@distill_group.command("train")
@config_flags(TrainConfig, help=TRAIN_HELP)
def train_cmd(config: TrainConfig) -> None:
    """LoRA SFT (+ DPO with --pairs-path) on CPU, merged and saved as a plain HF checkpoint."""
    from refinery.distill.train import train

    options = config.model_dump(exclude={"sft_path", "base", "out", "pairs_path"})
    try:
        result = train(config.sft_path, config.base, config.out, config.pairs_path, **options)
    except RefineryError as exc:
        fail(exc)
    except ModuleNotFoundError as exc:
        missing_extra(exc)
    click.echo(f"{result.out}: SFT {result.sft.steps} steps on {result.sft.expanded_rows} rows "
               f"(from {result.sft.rows}), loss on training rows {result.eval_loss_before} -> "
               f"{result.eval_loss_after}"
               + (f"; DPO {result.dpo.steps} steps on {result.dpo.rows} pairs" if result.dpo
                  else "") + f"; {result.seconds:.0f}s")


@distill_group.command("loop")
@config_flags(LoopConfig, help=LOOP_HELP)
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="show progress bars")
def loop_cmd(config: LoopConfig, progress: bool) -> None:
    """Sample -> verify -> build -> train -> evaluate plain cot on held-out problems, R rounds.

    With --pmd each round also builds procedural memory (round-R/memory) and trains
    on the self-teacher's solutions written with it in the prompt.

    With --ray the sampling step runs on --ray-replicas Ray actors (``eval run
    --ray``); training and the held-out evaluation stay on this machine.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from refinery.distill.loop import run_loop

    try:
        report = asyncio.run(run_loop(config, progress=progress))
    except RefineryError as exc:
        fail(exc)
    except ModuleNotFoundError as exc:
        missing_extra(exc)
    except KeyboardInterrupt:
        fail(f"interrupted; rerun the same command to resume from {config.out}", INTERRUPTED)
    click.echo(f"wrote {config.out}/loop.md and {config.out}/loop.json "
               f"({len(report.rounds)} round(s))")


def _choice(literal: object) -> click.Choice:
    return click.Choice(list(typing.get_args(literal)))


@distill_group.command("build")
@click.option("--runs", multiple=True, required=True, help="eval run directory (repeatable)")
@click.option("--sft", type=click.Path(dir_okay=False), help="output SFT JSONL")
@click.option("--pairs", type=click.Path(dir_okay=False), help="output preference-pair JSONL")
@click.option("--prm", type=click.Path(dir_okay=False),
              help="output stepwise-supervision JSONL (PRM data) from step-search runs "
              "(beam, dvts, particle)")
@click.option("--format", "sft_format", type=_choice(SFTFormat), default="messages",
              show_default=True, help="SFT row form (TRL conversational)")
@click.option("--cot-instruction", is_flag=True,
              help="append plain cot's instruction to prompts (match cot evaluation)")
@click.option("--instruction", help="text appended to every prompt")
@click.option("--max-per-prompt", type=click.IntRange(min=1), default=4, show_default=True,
              help="SFT examples per prompt")
@click.option("--max-pairs-per-prompt", type=click.IntRange(min=1), default=4,
              show_default=True, help="preference pairs per prompt")
@click.option("--max-length-ratio", type=click.FloatRange(min=1.0), default=1.5,
              show_default=True, help="skip pairs with chosen > RATIO x rejected")
@click.option("--explicit-answer/--no-explicit-answer", default=True, show_default=True,
              help="require a stated final answer (boxed, ####, 'the answer is')")
@click.option("--prompt-filter", type=_choice(PromptFilter), default="raft",
              show_default=True, help="raft: every verified attempt; reinforce_rej: "
              "prompts whose attempts all passed dropped too")
@click.option("--program-rows", type=_choice(ProgramRows), default="rationale",
              show_default=True, help="a verified program (pot) becomes the worked "
              "solution it computes, or stays code")
def build_cmd(runs: tuple[str, ...], sft: str | None, pairs: str | None, prm: str | None,
              sft_format: str, cot_instruction: bool, instruction: str | None,
              max_per_prompt: int, max_pairs_per_prompt: int, max_length_ratio: float,
              explicit_answer: bool, prompt_filter: str, program_rows: str) -> None:
    """Select verified solutions and preference pairs from eval runs (traces + results);
    with --prm, a step search's scored steps, labelled by the outcomes below each."""
    if sft is None and prm is None:
        fail("pass --sft (and --pairs), --prm, or both", USAGE)
    if sft is None and pairs is not None:  # refused before anything is written
        fail("--pairs comes with --sft", USAGE)
    if cot_instruction and instruction:
        fail("pass either --cot-instruction or --instruction, not both", USAGE)
    if prm is not None:
        _build_prm_rows(list(runs), prm)
    if sft is None:
        return
    from refinery.distill.dataset import build

    if cot_instruction:
        from refinery.strategies.cot import INSTRUCTION
        instruction = INSTRUCTION
    try:
        stats = build(list(runs), sft, pairs, instruction=instruction, sft_format=sft_format,
                      max_per_prompt=max_per_prompt, max_pairs_per_prompt=max_pairs_per_prompt,
                      max_length_ratio=max_length_ratio,
                      require_explicit_answer=explicit_answer,
                      prompt_filter=prompt_filter, program_rows=program_rows)
    except RefineryError as exc:
        fail(exc)
    click.echo(f"{stats.traces} traces, {stats.problems} problems, {stats.candidates} "
               f"candidate solutions; dropped {stats.dropped}; {stats.no_passing_attempt} "
               f"problems with no passing attempt; rescued {stats.rescued}, easy {stats.easy}")
    click.echo(f"wrote {stats.sft_rows} SFT rows (weighted {stats.weighted_sft_rows:g}) to "
               f"{sft}" + (f" and {stats.pairs} pairs {stats.pairs_by_source} to {pairs} "
                           f"({stats.pairs_skipped_length} skipped for length)" if pairs else ""))
    if stats.sft_rows == 0:
        fail("no verified SFT rows: every problem lacked a clean passing attempt", USAGE)


def _build_prm_rows(runs: list[str], out: str) -> None:
    """``--prm``: the runs' stepwise rows written to ``out``, or the error said."""
    from refinery.distill.stepwise import build_stepwise

    try:
        stats = build_stepwise(runs, out)
    except RefineryError as exc:
        fail(exc)
    click.echo(f"{stats.traces} traces, {stats.searched} of a step search "
               f"({stats.without_gold} without gold); wrote {stats.rows} stepwise rows to "
               f"{out}: {stats.right_steps} steps labelled right, {stats.wrong_steps} wrong")
    if stats.rows == 0:
        fail("no stepwise rows: no search path finished on a problem with gold", USAGE)
