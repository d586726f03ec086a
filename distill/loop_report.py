"""The distillation loop's settings and its report: one row per round, as a markdown table.

:func:`~refinery.distill.loop.run_loop` takes a :class:`LoopConfig` and, after
every round, writes the :class:`LoopReport` so far to ``OUT/loop.json`` (read back
by :func:`read_report`) and ``OUT/loop.md``.

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> report = LoopReport(config=LoopConfig(out=str(out)), eval_problems=100)
    >>> write_report(report, out)
    >>> read_report(out / "loop.json") == report, sorted(p.name for p in out.iterdir())
    (True, ['loop.json', 'loop.md'])
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from refinery.distill.dataset import BuildStats
from refinery.distill.memory import MemoryStats
from refinery.distill.selection import ProgramRows, PromptFilter
from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.metrics import Accuracy
from refinery.eval.ray_pool import RayOptions

__all__ = ["DEFAULT_SAMPLER", "LoopConfig", "LoopReport", "RoundReport", "read_report",
           "write_report"]

# Programs the sandbox runs find verified answers where the model's own votes do not
# (docs/results.md): the default sampler, its programs distilled as worked solutions.
DEFAULT_SAMPLER = "sc(pot, n=4)"


class LoopConfig(BaseModel):
    """Settings of a distillation loop.

    ``train`` holds :class:`~refinery.distill.train.TrainConfig` overrides (``max_steps``,
    ``batch_size``, ``learning_rate``, ...). ``gold_fallback_rows``: when the
    model's own verified data has fewer SFT rows than this, reference solutions
    of unsolved train problems fill the gap (``arith`` only; rows are marked
    ``verifier="gold"``); 0 = never, the default.

    Example:
        >>> LoopConfig(out="runs/d").strategy
        'sc(pot, n=4)'
    """

    dataset: str = "arith"
    strategy: str = Field(DEFAULT_SAMPLER, description="the sampler (default: the strongest "
                          "measured on arith: programs whose runs are verified)")
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
    prompt_filter: PromptFilter = Field("raft", description="raft: every verified attempt; "
                                        "reinforce_rej: all-right prompts dropped too")
    program_rows: ProgramRows = Field("rationale", description="a verified program becomes "
                                      "the worked solution it computes, or stays code")
    eval_sampler: bool = Field(True, description="also evaluate the sampler on the test split")
    pmd: bool = Field(False, description="procedural memory: lessons from each round's "
                      "attempts; the training targets are solved with them in the prompt")
    teacher_url: str | None = Field(None, description="an OpenAI-compatible endpoint that "
                                    "writes the lessons (default: the policy itself)")
    teacher_model: str | None = None
    max_lessons: int = Field(64, ge=1)
    train: dict[str, Any] = Field(default_factory=dict)
    isolate_training: bool = True
    ray: RayOptions | None = Field(None, description="sample on Ray actors (the train split "
                                   "and the round's weights must be readable on every node)")


class RoundReport(BaseModel):
    """One round: data made, training, and held-out accuracy before/after.

    Example:
        >>> from refinery.eval.metrics import accuracy
        >>> r = RoundReport(
        ...     round=1, model_in="base", model_out="round-1/model", train_problems=200,
        ...     sample_accuracy=accuracy([True, False]), sample_tokens_per_problem=310.0,
        ...     build=BuildStats(sft_rows=29), accuracy_before=accuracy([True] * 3 + [False] * 97),
        ...     accuracy_after=accuracy([True] * 5 + [False] * 95))
        >>> round(r.delta, 2), r.rows_per_100, str(r.accuracy_before)
        (0.02, 14.5, '3.0% (1.0-8.5)')
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
    sampler_before: Accuracy | None = None
    sampler_after: Accuracy | None = None
    memory: MemoryStats | None = None
    seconds: dict[str, float] = Field(default_factory=dict)

    @property
    def delta(self) -> float:
        return self.accuracy_after.value - self.accuracy_before.value

    @property
    def rows_per_100(self) -> float:
        """SFT rows kept per 100 train problems."""
        return 100 * self.build.sft_rows / max(self.train_problems, 1)


class LoopReport(BaseModel):
    """Every round of a loop, renderable as a markdown table.

    Example:
        >>> report = LoopReport(config=LoopConfig(dataset="arith"), eval_problems=100)
        >>> report.markdown().splitlines()[0][:56]
        'Distillation loop on `arith`: sample with `sc(pot, n=4)`'
    """

    config: LoopConfig
    eval_problems: int
    rounds: list[RoundReport] = Field(default_factory=list)

    def markdown(self) -> str:
        c = self.config
        lines = [
            f"Distillation loop on `{c.dataset}`: sample with `{c.strategy}` "
            f"(T={c.sample_temperature}, {c.prompt_filter}{', PMD' if c.pmd else ''}) on "
            f"{c.train_size} train problems; evaluate `{c.eval_strategy}` "
            f"(T={c.eval_temperature}){' and the sampler' if c.eval_sampler else ''} on "
            f"{self.eval_problems} held-out test problems.",
            "",
            "| round | sampler acc (train) | SFT rows (per 100) | pairs | gold rows | lessons "
            "kept / written | steps | loss before -> after | "
            f"`{c.eval_strategy}` before | after | Δ | sampler before | after | minutes |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rounds:
            b, m = r.build, r.memory
            loss = (f"{r.loss_before:.3f} -> {r.loss_after:.3f}"
                    if r.loss_before is not None and r.loss_after is not None else "-")
            lessons = f"{m.lessons_kept} / {m.lessons_written}" if m else "-"
            lines.append(
                f"| {r.round} | {r.sample_accuracy} | {b.sft_rows} ({r.rows_per_100:.0f}) | "
                f"{b.pairs} | {r.gold_rows} | {lessons} | {r.train_steps} | {loss} | "
                f"{r.accuracy_before} | {r.accuracy_after} | {100 * r.delta:+.1f} pts | "
                f"{r.sampler_before or '-'} | {r.sampler_after or '-'} | "
                f"{sum(r.seconds.values()) / 60:.1f} |")
        return "\n".join(lines) + "\n"


def write_report(report: LoopReport, out: Path) -> None:
    """``report`` as ``out/loop.json`` and ``out/loop.md``, each replaced atomically."""
    for name, body in (("loop.json", report.model_dump_json(indent=2) + "\n"),
                       ("loop.md", report.markdown())):
        tmp = out / f".{name}.tmp"
        tmp.write_text(body, encoding="utf-8")
        os.replace(tmp, out / name)



def read_report(path: str | os.PathLike[str]) -> LoopReport:
    """Read a ``loop.json`` back."""
    return LoopReport.model_validate(json.loads(Path(path).read_text()))
