"""``refinery distill``: build training data from runs, fine-tune, run the distillation loop.

The lead mounts :data:`distill_app` as ``refinery distill``. Bad input (a
missing run or dataset file, an empty dataset, an existing output model, a bad
option) prints one ``error:`` line and exits with status 2.

Example:
    $ refinery distill build --runs runs/sc4-train --sft out/sft.jsonl --pairs out/pairs.jsonl
    $ refinery distill train --sft out/sft.jsonl --out models/arith-r1
    $ refinery distill loop --dataset arith --strategy "sc(pot, n=4)" --rounds 2 --pmd
"""

from __future__ import annotations

import asyncio
import os
from enum import Enum

import typer
from pydantic import ValidationError

from refinery.engine.cli_options import (
    LevelsOption,
    MaxTokensOption,
    ModelOption,
    ProgressOption,
    RayAddressOption,
    RayOption,
    ReplicasOption,
    TemperatureOption,
)
from refinery.engine.console import INTERRUPTED, USAGE, bad_option, fail
from refinery.engine.errors import RefineryError
from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.ray_pool import RayOptions

__all__ = ["distill_app"]

distill_app = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="Traces -> SFT / preference data -> LoRA fine-tuning -> eval.")


class SFTFormatKind(str, Enum):
    messages = "messages"
    prompt_completion = "prompt_completion"


class PromptFilterKind(str, Enum):
    raft = "raft"
    reinforce_rej = "reinforce_rej"


class ProgramRowsKind(str, Enum):
    rationale = "rationale"
    program = "program"


FilterOption = typer.Option(PromptFilterKind.raft, "--filter", help=(
    "raft: every verified attempt; reinforce_rej: prompts whose attempts all passed dropped too"))
ProgramRowsOption = typer.Option(ProgramRowsKind.rationale, help=(
    "a verified program (pot) becomes the worked solution it computes, or stays code"))


@distill_app.command("build")
def build_cmd(
    runs: list[str] = typer.Option(..., "--runs", help="eval run directory (repeatable)"),
    sft: str = typer.Option(None, help="output SFT JSONL"),
    pairs: str = typer.Option(None, help="output preference-pair JSONL"),
    prm: str = typer.Option(None, help="output stepwise-supervision JSONL (PRM data) from "
                                       "step-search runs (beam, dvts, particle)"),
    format: SFTFormatKind = typer.Option(SFTFormatKind.messages,  # noqa: A002 - CLI name
                                         help="SFT row form (TRL conversational)"),
    cot_instruction: bool = typer.Option(
        False, help="append plain cot's instruction to prompts (match cot evaluation)"),
    instruction: str = typer.Option(None, help="text appended to every prompt"),
    max_per_prompt: int = typer.Option(4, min=1, help="SFT examples per prompt"),
    max_pairs_per_prompt: int = typer.Option(4, min=1, help="preference pairs per prompt"),
    max_length_ratio: float = typer.Option(1.5, min=1.0,
                                           help="skip pairs with chosen > RATIO x rejected"),
    explicit_answer: bool = typer.Option(
        True, help="require a stated final answer (boxed, ####, 'the answer is')"),
    prompt_filter: PromptFilterKind = FilterOption,
    program_rows: ProgramRowsKind = ProgramRowsOption,
) -> None:
    """Select verified solutions and preference pairs from eval runs (traces + results);
    with --prm, a step search's scored steps, labelled by the outcomes below each."""
    if sft is None and prm is None:
        fail("pass --sft (and --pairs), --prm, or both", USAGE)
    if sft is None and pairs is not None:  # refused before anything is written
        fail("--pairs comes with --sft", USAGE)
    if prm is not None:
        build_prm_rows(runs, prm)
    if sft is None:
        return
    from refinery.distill.dataset import build

    if cot_instruction and instruction:
        fail("pass either --cot-instruction or --instruction, not both", USAGE)
    if cot_instruction:
        from refinery.strategies.cot import INSTRUCTION
        instruction = INSTRUCTION
    try:
        stats = build(runs, sft, pairs, instruction=instruction, sft_format=format.value,
                      max_per_prompt=max_per_prompt, max_pairs_per_prompt=max_pairs_per_prompt,
                      max_length_ratio=max_length_ratio,
                      require_explicit_answer=explicit_answer,
                      prompt_filter=prompt_filter.value, program_rows=program_rows.value)
    except RefineryError as exc:
        fail(exc)
    typer.echo(f"{stats.traces} traces, {stats.problems} problems, {stats.candidates} "
               f"candidate solutions; dropped {stats.dropped}; {stats.no_passing_attempt} "
               f"problems with no passing attempt; rescued {stats.rescued}, easy {stats.easy}")
    typer.echo(f"wrote {stats.sft_rows} SFT rows (weighted {stats.weighted_sft_rows:g}) to "
               f"{sft}" + (f" and {stats.pairs} pairs {stats.pairs_by_source} to {pairs} "
                           f"({stats.pairs_skipped_length} skipped for length)" if pairs else ""))
    if stats.sft_rows == 0:
        fail("no verified SFT rows: every problem lacked a clean passing attempt", USAGE)


def build_prm_rows(runs: list[str], out: str) -> None:
    """``--prm``: the runs' stepwise rows written to ``out``, or the error said."""
    from refinery.distill.stepwise import build_stepwise

    try:
        stats = build_stepwise(runs, out)
    except RefineryError as exc:
        fail(exc)
    typer.echo(f"{stats.traces} traces, {stats.searched} of a step search "
               f"({stats.without_gold} without gold); wrote {stats.rows} stepwise rows to "
               f"{out}: {stats.right_steps} steps labelled right, {stats.wrong_steps} wrong")
    if stats.rows == 0:
        fail("no stepwise rows: no search path finished on a problem with gold", USAGE)


@distill_app.command("train")
def train_cmd(
    sft: str = typer.Option(..., help="SFT JSONL from `distill build`"),
    out: str = typer.Option(..., help="directory of the merged checkpoint"),
    base: ModelOption = DEFAULT_MODEL,
    pairs: str = typer.Option(None, help="preference JSONL: DPO after SFT"),
    max_steps: int = typer.Option(None, min=1, help="optimizer steps (overrides --epochs)"),
    epochs: float = typer.Option(1.0, min=0.01),
    batch_size: int = typer.Option(8, min=1),
    grad_accum: int = typer.Option(1, min=1),
    lr: float = typer.Option(2e-4, min=0.0, help="SFT learning rate"),
    max_length: int = typer.Option(512, min=16, help="tokens per example"),
    lora_r: int = typer.Option(16, min=1),
    lora_alpha: int = typer.Option(32, min=1),
    dpo_beta: float = typer.Option(0.1, min=0.0),
    dpo_lr: float = typer.Option(5e-5, min=0.0),
    dpo_steps: int = typer.Option(None, min=1, help="DPO steps (default: one epoch)"),
    threads: int = typer.Option(None, min=1, help="torch threads (default: the idle cores)"),
    save_dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16"),
    seed: int = typer.Option(0),
    overwrite: bool = typer.Option(False, help="replace an existing OUT"),
    progress: ProgressOption = True,
) -> None:
    """LoRA SFT (+ DPO with --pairs) on CPU, merged and saved as a plain HF checkpoint."""
    from refinery.distill.train import train

    try:
        result = train(sft, base, out, pairs, max_steps=max_steps, epochs=epochs,
                       batch_size=batch_size, grad_accum=grad_accum, learning_rate=lr,
                       max_length=max_length, lora_r=lora_r, lora_alpha=lora_alpha,
                       dpo_beta=dpo_beta, dpo_learning_rate=dpo_lr, dpo_max_steps=dpo_steps,
                       threads=threads, save_dtype=save_dtype, seed=seed,
                       overwrite=overwrite, progress=progress)
    except RefineryError as exc:
        fail(exc)
    except ValidationError as exc:
        bad_option(exc)
    typer.echo(f"{result.out}: SFT {result.sft.steps} steps on {result.sft.expanded_rows} rows "
               f"(from {result.sft.rows}), loss on training rows {result.eval_loss_before} -> "
               f"{result.eval_loss_after}"
               + (f"; DPO {result.dpo.steps} steps on {result.dpo.rows} pairs" if result.dpo
                  else "") + f"; {result.seconds:.0f}s")


@distill_app.command("loop")
def loop_cmd(
    dataset: str = typer.Option("arith", help="dataset with train and test splits"),
    strategy: str = typer.Option("sc(pot, n=4)", help="sampling strategy spec"),
    rounds: int = typer.Option(1, min=1),
    train_size: int = typer.Option(200, min=1, help="train-split problems sampled per round"),
    eval_size: int = typer.Option(100, min=1, help="held-out test problems"),
    base: ModelOption = DEFAULT_MODEL,
    out: str = typer.Option("runs/distill", help="loop directory (rerun to resume)"),
    max_tokens: MaxTokensOption = 384,
    sample_temperature: TemperatureOption = 0.7,
    eval_temperature: TemperatureOption = 0.0,
    max_steps: int = typer.Option(None, min=1, help="training steps per round"),
    epochs: float = typer.Option(1.0, min=0.01, help="training epochs per round"),
    batch_size: int = typer.Option(8, min=1),
    lr: float = typer.Option(2e-4, min=0.0),
    pairs: bool = typer.Option(False, help="also train DPO on preference pairs"),
    gold_fallback_rows: int = typer.Option(
        0, min=0, help="top SFT data up to this many rows with reference solutions (arith)"),
    seed: int = typer.Option(0, help="dataset generator seed"),
    level: LevelsOption = None,
    prompt_filter: PromptFilterKind = FilterOption,
    program_rows: ProgramRowsKind = ProgramRowsOption,
    eval_sampler: bool = typer.Option(True, help="also evaluate the sampler on the test split"),
    pmd: bool = typer.Option(False, help="procedural memory: lessons from each round's "
                             "attempts; training targets solved with them in the prompt"),
    teacher: str = typer.Option(None, help="OpenAI-compatible base URL of the model that "
                                "writes the lessons (default: the policy)"),
    teacher_model: str = typer.Option(None, help="the teacher's model name"),
    max_lessons: int = typer.Option(64, min=1, help="problems asked for a lesson per round"),
    progress: ProgressOption = True,
    ray: RayOption = False,
    ray_address: RayAddressOption = None,
    replicas: ReplicasOption = 1,
) -> None:
    """Sample -> verify -> build -> train -> evaluate plain cot on held-out problems, R rounds.

    With --pmd each round also builds procedural memory (round-R/memory) and trains
    on the self-teacher's solutions written with it in the prompt.

    With --ray the sampling step runs on REPLICAS Ray actors (``eval run --ray``);
    training and the held-out evaluation stay on this machine.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from refinery.distill.loop import loop

    train_opts = {"epochs": epochs, "batch_size": batch_size, "learning_rate": lr}
    if max_steps:
        train_opts["max_steps"] = max_steps
    try:
        report = asyncio.run(loop(
            dataset, strategy, rounds, train_size, eval_size, base=base, out=out,
            max_tokens=max_tokens, sample_temperature=sample_temperature,
            eval_temperature=eval_temperature, pairs=pairs,
            gold_fallback_rows=gold_fallback_rows, seed=seed,
            levels=list(level) if level else None, train=train_opts, progress=progress,
            prompt_filter=prompt_filter.value, program_rows=program_rows.value,
            eval_sampler=eval_sampler, pmd=pmd, teacher_url=teacher,
            teacher_model=teacher_model, max_lessons=max_lessons,
            ray=RayOptions(address=ray_address, replicas=replicas) if ray else None))
    except RefineryError as exc:
        fail(exc)
    except ValidationError as exc:
        bad_option(exc)
    except KeyboardInterrupt:
        fail(f"interrupted; rerun the same command to resume from {out}", INTERRUPTED)
    typer.echo(f"wrote {out}/loop.md and {out}/loop.json ({len(report.rounds)} round(s))")


if __name__ == "__main__":  # python -m refinery.distill.cli ...
    distill_app()
