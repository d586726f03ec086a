"""Real LoRA training of the embedded model: SFT, then DPO on preference pairs.

The loop's e2e test trains SFT only; this one covers ``pairs_path``: DPO runs
after SFT on the merged model, both stages are recorded, and the saved
checkpoint is a plain merged model (no adapter files) whose weights moved.
A few optimizer steps on a handful of rows, about half a minute on 2 cores.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from refinery.distill.schema import PairRow, write_rows
from refinery.distill.train import read_train_record, train
from refinery.engine.models import DEFAULT_MODEL, resolve_model

pytestmark = pytest.mark.e2e

PROBLEMS = [("What is 12 + 30?", "42"), ("What is 7 * 6?", "42"), ("What is 50 - 8?", "42"),
            ("What is 84 / 2?", "42")]


def _provenance(i: int, **extra) -> dict:
    return {"source_run": "runs/x", "problem_id": f"p{i}", "step": "draft",
            "verifier": "math", "weight": 1.0, **extra}


def _rows() -> tuple[list[dict], list[PairRow]]:
    sft, pairs = [], []
    for i, (q, a) in enumerate(PROBLEMS):
        user = {"role": "user", "content": q}
        good = {"role": "assistant", "content": f"Working it out, it is {a}. \\boxed{{{a}}}"}
        bad = {"role": "assistant", "content": f"I guess {int(a) + 1}. \\boxed{{{int(a) + 1}}}"}
        sft.append({"messages": [user, good], "metadata": _provenance(i)})
        pairs.append(PairRow.model_validate({
            "prompt": [user], "chosen": [good], "rejected": [bad],
            "metadata": _provenance(i, pair_source="correct_incorrect",
                                    rejected_step="draft", length_ratio=0.5)}))
    return sft, pairs


def test_sft_then_dpo_saves_a_merged_model_with_both_stages(tmp_path) -> None:
    from safetensors.torch import load_file

    sft, pairs = _rows()
    write_rows(tmp_path / "sft.jsonl", sft, "sft")
    write_rows(tmp_path / "pairs.jsonl", pairs, "pair")
    out = tmp_path / "model"
    result = train(tmp_path / "sft.jsonl", DEFAULT_MODEL, out, pairs_path=tmp_path / "pairs.jsonl",
                   max_steps=2, dpo_max_steps=2, batch_size=2, max_length=128,
                   loss_eval_rows=4, learning_rate=1e-3, dpo_learning_rate=1e-3,
                   threads=2, progress=False)
    assert result.sft.steps == 2 and result.sft.rows == 4
    assert result.dpo is not None and result.dpo.steps == 2 and result.dpo.rows == 4
    assert all(math.isfinite(x) for x in result.sft.losses + result.dpo.losses)
    assert result.eval_loss_after < result.eval_loss_before  # SFT at lr 1e-3 on 4 rows
    assert read_train_record(out).dpo.steps == 2  # the record on disk says the same
    files = {p.name for p in out.iterdir()}
    assert "model.safetensors" in files and not any("adapter" in f for f in files)
    tuned = load_file(out / "model.safetensors")
    base = load_file(Path(resolve_model(DEFAULT_MODEL)) / "model.safetensors")
    name = next(k for k in tuned if k.endswith("q_proj.weight"))
    assert tuned[name].shape == base[name].shape
    assert (tuned[name].float() - base[name].float()).abs().max() > 0  # LoRA merged in
