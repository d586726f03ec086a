"""Distillation: verified refinement traces -> training data -> LoRA fine-tuning -> eval.

Imports engine, verifiers, strategies and eval only (never serving or refinery).

- :mod:`refinery.distill.dataset` selects SFT rows and preference pairs from eval runs;
- :mod:`refinery.distill.schema` validates and writes them (TRL conversational formats);
- :mod:`refinery.distill.train` runs LoRA SFT (+ DPO) on CPU and saves a merged checkpoint;
- :mod:`refinery.distill.loop` repeats sample -> verify -> build -> train -> evaluate
  (:mod:`refinery.distill.loop_report`: its settings and the table of its rounds).

Example:
    >>> from refinery.distill import build, train
    >>> stats = build(["runs/sc4-train"], "out/sft.jsonl", "out/pairs.jsonl")  # doctest: +SKIP
    >>> result = train("out/sft.jsonl", out="models/arith-r1")  # doctest: +SKIP
"""

from refinery.distill.dataset import (
    SOLUTION_STEPS,
    BuildStats,
    Candidate,
    arith_solution,
    build,
    build_rows,
    clean_solution,
    gold_sft_rows,
    load_candidates,
)
from refinery.distill.loop import loop, run_loop
from refinery.distill.loop_report import LoopConfig, LoopReport, RoundReport, read_report
from refinery.distill.schema import (
    ChatMessage,
    DistillError,
    MessagesRow,
    PairProvenance,
    PairRow,
    PromptCompletionRow,
    Provenance,
    StepwiseProvenance,
    StepwiseRow,
    read_rows,
    validate_pair_row,
    validate_sft_row,
    validate_stepwise_row,
    write_rows,
)
from refinery.distill.stepwise import StepwiseStats, build_stepwise
from refinery.distill.train import (
    TRAIN_RECORD,
    TrainConfig,
    TrainResult,
    expand_weights,
    read_train_record,
    train,
)

__all__ = [
    "SOLUTION_STEPS",
    "TRAIN_RECORD",
    "BuildStats",
    "Candidate",
    "ChatMessage",
    "DistillError",
    "LoopConfig",
    "LoopReport",
    "MessagesRow",
    "PairProvenance",
    "PairRow",
    "PromptCompletionRow",
    "Provenance",
    "RoundReport",
    "StepwiseProvenance",
    "StepwiseRow",
    "StepwiseStats",
    "TrainConfig",
    "TrainResult",
    "arith_solution",
    "build",
    "build_rows",
    "build_stepwise",
    "clean_solution",
    "expand_weights",
    "gold_sft_rows",
    "load_candidates",
    "loop",
    "read_report",
    "read_rows",
    "read_train_record",
    "run_loop",
    "train",
    "validate_pair_row",
    "validate_sft_row",
    "validate_stepwise_row",
    "write_rows",
]
