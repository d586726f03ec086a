"""LoRA fine-tuning on distilled rows (TRL + peft, CPU), merged into a plain HF checkpoint.

SFT with TRL's ``SFTTrainer`` and a peft LoRA (r=16, all linear layers) on the
base checkpoint (``refinery.engine.models.resolve_model``: a registered name, by default
the embedded ``DEFAULT_MODEL``, or a local checkpoint directory, e.g. the previous round of
the loop); then, when preference rows are given, DPO with ``DPOTrainer`` and a
fresh LoRA on the SFT-merged model (its reference is that same model with the
adapter disabled). Each stage ends in ``merge_and_unload()``; the result is
saved with ``save_pretrained`` (model + tokenizer) so vLLM loads it by path.

Details that matter:

- Rows are turned into TRL's ``prompt``/``completion`` form, so the loss is on
  the answer only (the model learns to answer, not to write prompts).
- Row weights are honoured by repetition: each row appears
  ``round(weight / smallest weight)`` times (weights 0.5 / 1 / 2 -> 1 / 2 / 4 copies).
- "Loss goes down" is measured, not inferred from noisy per-step logs: the mean
  completion loss on (up to ``loss_eval_rows``) training rows is evaluated
  before and after training.
- Training runs in float32 (CPU; bf16 autocast is slow and imprecise there);
  the checkpoint is saved in float32 by default, so the exact trained weights
  are kept for the next round and for transformers (a few LoRA steps move
  weights by ~1e-4, below bf16's resolution). The engine's ``dtype="auto"``
  serves a float32 checkpoint in bf16 on a CPU with native bf16 and in float32
  elsewhere (``refinery.engine.hardware``), so on the former what vLLM answers
  with is the bf16 rounding of these weights (``save_dtype`` to change).
- Torch uses as many threads as there are idle cores when training starts
  (:func:`default_threads`): OpenMP threads spinning against a busy core (a
  vLLM worker) slow training by 10-30x here, and one thread leaves an idle
  core unused.
- The checkpoint is written to a hidden temporary sibling directory and renamed
  into place, so a crash leaves no half-written model; ``refinery_train.json``
  (config, losses, row counts, times) is written inside it before the rename.

Measured here (2 cores): 8 steps of batch 8, max_length 512 about 200 s.

Example:
    >>> result = train("out/sft.jsonl", out="models/arith-r1", max_steps=8)  # doctest: +SKIP
    >>> result.eval_loss_before, result.eval_loss_after  # doctest: +SKIP
    (1.92, 1.41)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from refinery.distill.schema import DistillError, MessagesRow, PairRow, read_rows
from refinery.engine.models import DEFAULT_MODEL

__all__ = ["TRAIN_RECORD", "TrainConfig", "TrainResult", "default_threads", "expand_weights",
           "free_cores", "read_train_record", "train"]

TRAIN_RECORD = "refinery_train.json"


class TrainConfig(BaseModel):
    """Every knob of one training job (saved beside the checkpoint).

    Example:
        >>> TrainConfig(sft_path="out/sft.jsonl", out="models/m").lora_r
        16
    """

    sft_path: str
    out: str
    base: str = DEFAULT_MODEL
    pairs_path: str | None = None
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="overrides epochs")
    batch_size: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)
    learning_rate: float = Field(2e-4, gt=0)
    max_length: int = Field(512, ge=16)
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    dpo_beta: float = Field(0.1, gt=0)
    dpo_learning_rate: float = Field(5e-5, gt=0)
    dpo_epochs: float = Field(1.0, gt=0)
    dpo_max_steps: int | None = Field(None, ge=1)
    max_repeat: int = Field(8, ge=1, description="cap on copies of one row from its weight")
    trainable_tokens: list[str] = Field(
        default_factory=list, description="tokens whose embedding rows train beside the LoRA "
        "(added tokens; a tied output layer follows)")
    loss_eval_rows: int = Field(64, ge=0, description="rows for the before/after loss; 0 = off")
    save_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: int = 0
    threads: int | None = Field(None, ge=1, description="torch threads (None: the idle cores)")
    overwrite: bool = False
    progress: bool = True


class StageResult(BaseModel):
    """One trainer run (SFT or DPO): rows, steps and the logged losses.

    Example:
        >>> read_train_record("models/arith-r1").sft.losses  # doctest: +SKIP
        [0.77, 0.87, 0.8, 0.72]
    """

    rows: int
    expanded_rows: int
    steps: int
    losses: list[float] = Field(default_factory=list)
    logs: list[dict[str, Any]] = Field(default_factory=list)
    seconds: float = 0.0


class TrainResult(BaseModel):
    """What :func:`train` did; also stored as ``refinery_train.json`` in the checkpoint.

    Example:
        >>> r = read_train_record("models/arith-r1")  # doctest: +SKIP
        >>> r.eval_loss_before, r.eval_loss_after, r.sft.steps  # doctest: +SKIP
        (0.81, 0.74, 4)
    """

    out: str
    base: str
    base_dir: str
    config: TrainConfig
    sft: StageResult
    dpo: StageResult | None = None
    eval_loss_before: float | None = None
    eval_loss_after: float | None = None
    seconds: float = 0.0
    threads: int | None = None  # torch threads used (``config.threads`` or the idle cores)
    versions: dict[str, str] = Field(default_factory=dict)

    @property
    def loss_first(self) -> float | None:
        return self.sft.losses[0] if self.sft.losses else None

    @property
    def loss_last(self) -> float | None:
        return self.sft.losses[-1] if self.sft.losses else None


def expand_weights(weights: Sequence[float], max_repeat: int = 8) -> list[int]:
    """Copies per row so that frequencies follow the weights.

    Example:
        >>> expand_weights([0.5, 1.0, 2.0])
        [1, 2, 4]
    """
    if not weights:
        return []
    low = min(w for w in weights if w > 0)
    return [max(1, min(max_repeat, round(w / low))) for w in weights]


def free_cores(busy_percent: Sequence[float]) -> int:
    """Whole cores left idle, given each usable core's busy percentage.

    Example:
        >>> free_cores([3.0, 97.0]), free_cores([2.0, 5.0]), free_cores([60.0, 70.0])
        (1, 2, 0)
    """
    idle = sum(max(0.0, 100.0 - p) for p in busy_percent) / 100.0
    return int(idle + 0.25)  # a core counts once it is at least three quarters idle


def default_threads(sample_seconds: float = 0.5) -> int:
    """Torch threads for training: the cores idle right now (at least one).

    OpenMP threads spinning against a busy core (a vLLM worker) slow training by
    10-30x: 2 SFT steps took 163 s with 2 threads (load 8) and 5 s with 1 thread
    on the same rows. On idle cores it is the other way round: in the distill
    loop's e2e test, training took 56 s on 1 thread and 44 s on 2, same losses
    (2-core EPYC-512). So count the cores idle over a short sample, among those
    this process may run on.
    """
    import psutil

    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    busy = psutil.cpu_percent(interval=sample_seconds, percpu=True)
    if usable is not None:
        busy = [busy[i] for i in usable if i < len(busy)]
    return max(1, free_cores(busy))


def _sft_examples(rows: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if isinstance(r, MessagesRow):
            prompt, completion = r.messages[:-1], r.messages[-1:]
        else:
            prompt, completion = r.prompt, r.completion
        out.append({"prompt": [m.model_dump() for m in prompt],
                    "completion": [m.model_dump() for m in completion]})
    return out


def _pair_examples(rows: Sequence[PairRow]) -> list[dict[str, Any]]:
    return [{"prompt": [m.model_dump() for m in r.prompt],
             "chosen": [m.model_dump() for m in r.chosen],
             "rejected": [m.model_dump() for m in r.rejected]} for r in rows]


def _repeat(examples: list[dict[str, Any]], copies: Sequence[int]) -> list[dict[str, Any]]:
    return [ex for ex, k in zip(examples, copies, strict=True) for _ in range(k)]


def _losses(history: Sequence[dict[str, Any]]) -> tuple[list[float], list[dict[str, Any]]]:
    logs = [{k: v for k, v in h.items() if isinstance(v, int | float)} for h in history
            if "loss" in h]
    return [float(h["loss"]) for h in logs], logs


def _versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "transformers", "trl", "peft", "datasets"):
        try:
            from importlib.metadata import version
            out[name] = version(name)
        except Exception:  # not installed: nothing to record
            pass
    return out


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise DistillError(f"{out} already exists; choose another --out or pass --overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a crashed run of ours
        shutil.rmtree(stale, ignore_errors=True)


def _common_args(cfg: TrainConfig, scratch: str) -> dict[str, Any]:
    return dict(output_dir=scratch, use_cpu=True, bf16=False, fp16=False,
                per_device_train_batch_size=cfg.batch_size,
                per_device_eval_batch_size=cfg.batch_size,
                gradient_accumulation_steps=cfg.grad_accum, gradient_checkpointing=False,
                logging_steps=1, save_strategy="no", report_to="none", seed=cfg.seed,
                disable_tqdm=not cfg.progress, dataloader_num_workers=0,
                max_length=cfg.max_length, lr_scheduler_type="constant_with_warmup",
                warmup_steps=0, remove_unused_columns=True)


def train(sft_path: str | os.PathLike[str], base: str = DEFAULT_MODEL,
          out: str | os.PathLike[str] = "models/distilled",
          pairs_path: str | os.PathLike[str] | None = None, **options: Any) -> TrainResult:
    """LoRA SFT (then DPO if ``pairs_path``) of ``base`` on ``sft_path``; save a merged model.

    ``options`` are the other :class:`TrainConfig` fields (``max_steps``,
    ``batch_size``, ``learning_rate``, ``epochs``, ``overwrite``...).

    Raises:
        DistillError: missing / empty / invalid dataset, or ``out`` exists (no ``overwrite``).
        UnknownModelError: ``base`` does not resolve to a checkpoint.
    """
    cfg = TrainConfig(sft_path=str(sft_path), base=base, out=str(out),
                      pairs_path=None if pairs_path is None else str(pairs_path), **options)
    t0 = time.monotonic()
    out_p = Path(cfg.out)
    sft_rows = read_rows(cfg.sft_path, "sft")  # validates; raises on missing / empty
    pair_rows = read_rows(cfg.pairs_path, "pair") if cfg.pairs_path else []
    _check_out(out_p, cfg.overwrite)

    from refinery.engine.models import resolve_model

    base_dir = resolve_model(cfg.base)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = cfg.threads or default_threads()
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    scratch = tempfile.mkdtemp(prefix="refinery-train-")
    tmp_out = Path(tempfile.mkdtemp(prefix=f".{out_p.name}.tmp-", dir=out_p.parent))
    try:
        model, sft_stage, before, after = _sft(cfg, model, tokenizer, sft_rows, scratch)
        dpo_stage = None
        if pair_rows:
            model, dpo_stage = _dpo(cfg, model, tokenizer, pair_rows, scratch)
        model = model.to(getattr(torch, cfg.save_dtype))
        model.config.use_cache = True
        model.save_pretrained(tmp_out, safe_serialization=True)
        tokenizer.save_pretrained(tmp_out)
        result = TrainResult(out=str(out_p), base=cfg.base, base_dir=base_dir, config=cfg,
                             sft=sft_stage, dpo=dpo_stage,
                             eval_loss_before=_round(before), eval_loss_after=_round(after),
                             seconds=round(time.monotonic() - t0, 2), threads=threads,
                             versions=_versions())
        (tmp_out / TRAIN_RECORD).write_text(result.model_dump_json(indent=2) + "\n")
        _swap_in(tmp_out, out_p)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if tmp_out.exists():
            shutil.rmtree(tmp_out, ignore_errors=True)
    return result


def _lora(cfg: TrainConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules="all-linear", task_type="CAUSAL_LM")


def _train_token_rows(cfg: TrainConfig, model: Any, tokenizer: Any) -> None:
    """Let the embedding rows of ``cfg.trainable_tokens`` train beside the LoRA.

    New tokens start from an average embedding, which a LoRA on the linear layers
    cannot move. The rows train in place (the gradient masked to them), so a tied
    output layer, which shares the embedding's tensor, trains with them; peft's
    token wrappers do not survive TRL's fused LM head, which reads the head's tensor.
    """
    if not cfg.trainable_tokens:
        return
    ids = tokenizer.convert_tokens_to_ids(cfg.trainable_tokens)
    unknown = [t for t, i in zip(cfg.trainable_tokens, ids, strict=True)
               if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise DistillError(f"trainable tokens not in the base's vocabulary: {unknown}")
    weight = model.get_input_embeddings().weight
    mask = weight.new_zeros(weight.shape[0], 1)
    mask[ids] = 1.0
    weight.requires_grad_(True)
    weight.register_hook(lambda grad: grad * mask)


def _sft(cfg: TrainConfig, model: Any, tokenizer: Any, rows: list[MessagesRow],
         scratch: str) -> tuple[Any, StageResult, float | None, float | None]:
    """LoRA SFT on the completions, merged: the model, the stage, held-out loss before/after."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    examples = _sft_examples(rows)
    copies = expand_weights([r.metadata.weight for r in rows], cfg.max_repeat)
    train_ds = Dataset.from_list(_repeat(examples, copies))
    eval_ds = Dataset.from_list(examples[: cfg.loss_eval_rows]) if cfg.loss_eval_rows else None
    steps: dict[str, Any] = ({"max_steps": cfg.max_steps} if cfg.max_steps
                             else {"num_train_epochs": cfg.epochs})
    args = SFTConfig(**_common_args(cfg, scratch), learning_rate=cfg.learning_rate,
                     completion_only_loss=True, **steps)
    trainer = SFTTrainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                         processing_class=tokenizer, peft_config=_lora(cfg))
    _train_token_rows(cfg, trainer.model, tokenizer)
    before = trainer.evaluate()["eval_loss"] if eval_ds is not None else None
    t = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - t
    after = trainer.evaluate()["eval_loss"] if eval_ds is not None else None
    losses, logs = _losses(trainer.state.log_history)
    stage = StageResult(rows=len(rows), expanded_rows=len(train_ds),
                        steps=trainer.state.global_step, losses=losses, logs=logs,
                        seconds=round(seconds, 2))
    return trainer.model.merge_and_unload(), stage, before, after


def _dpo(cfg: TrainConfig, model: Any, tokenizer: Any, rows: list[PairRow],
         scratch: str) -> tuple[Any, StageResult]:
    """LoRA DPO on the preference pairs (the model before it is its reference), merged."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    copies = expand_weights([r.metadata.weight for r in rows], cfg.max_repeat)
    pair_ds = Dataset.from_list(_repeat(_pair_examples(rows), copies))
    steps: dict[str, Any] = ({"max_steps": cfg.dpo_max_steps} if cfg.dpo_max_steps
                             else {"num_train_epochs": cfg.dpo_epochs})
    args = DPOConfig(**_common_args(cfg, scratch), beta=cfg.dpo_beta,
                     learning_rate=cfg.dpo_learning_rate, **steps)
    trainer = DPOTrainer(model=model, ref_model=None, args=args, train_dataset=pair_ds,
                         processing_class=tokenizer, peft_config=_lora(cfg))
    t = time.monotonic()
    trainer.train()
    losses, logs = _losses(trainer.state.log_history)
    stage = StageResult(rows=len(rows), expanded_rows=len(pair_ds),
                        steps=trainer.state.global_step, losses=losses, logs=logs,
                        seconds=round(time.monotonic() - t, 2))
    return trainer.model.merge_and_unload(), stage


def _swap_in(tmp_out: Path, out: Path) -> None:
    """Move the finished model into place; an old one (``overwrite``) goes only after."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
        os.rename(tmp_out, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp_out, out)


def _round(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 5)


def read_train_record(model_dir: str | os.PathLike[str]) -> TrainResult:
    """The ``refinery_train.json`` saved beside a trained checkpoint.

    Raises:
        DistillError: the directory holds no training record.
    """
    p = Path(model_dir) / TRAIN_RECORD
    if not p.is_file():
        raise DistillError(f"{model_dir} holds no {TRAIN_RECORD} (not trained by refinery?)")
    return TrainResult.model_validate_json(p.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    """Train from a :class:`TrainConfig` JSON file (``main(["CONFIG.json"])``).

    The loop runs training this way, in a child process, so the trainer's memory
    and threads are released when it ends and a crash cannot take the loop down.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: main(['CONFIG.json'])", file=sys.stderr)
        return 2
    cfg = TrainConfig.model_validate(json.loads(Path(args[0]).read_text()))
    opts = cfg.model_dump(exclude={"sft_path", "base", "out", "pairs_path"})
    try:
        result = train(cfg.sft_path, cfg.base, cfg.out, cfg.pairs_path, **opts)
    except DistillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out": result.out, "eval_loss_before": result.eval_loss_before,
                      "eval_loss_after": result.eval_loss_after, "seconds": result.seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
