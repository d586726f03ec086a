"""One small round of the distillation loop on ``arith`` with the real model, end to end.

Sample ``sc(cot, n=4)`` on 12 train problems with the session's base engine ->
build -> LoRA SFT (3 steps of 4 rows, in a child process) -> merge -> a second
vLLM engine on the merged checkpoint evaluates plain cot on 8 held-out problems
(closed by the loop when done). If the 135M model verifiably solves fewer than 8
rows' worth of train problems, reference solutions of unsolved train problems
fill up to 8 rows (``gold_fallback_rows``): the point here is the plumbing.
About 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os

import pytest

from refinery.distill.loop import loop
from refinery.distill.schema import read_rows
from refinery.distill.train import read_train_record
from refinery.engine.models import DEFAULT_MODEL, resolve_model

pytestmark = pytest.mark.e2e


async def test_one_loop_round_on_arith(vllm_backend, tmp_path) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "loop"
    # Training threads left to the default (the idle cores): the session engine is
    # idle while it trains, so both cores here (training 56 s on 1 thread, 44 s on 2).
    report = await loop(
        "arith", "sc(cot, n=4)", rounds=1, train_size=12, eval_size=8, out=str(out),
        backend=vllm_backend, progress=False, max_tokens=192, gold_fallback_rows=8,
        train={"max_steps": 3, "batch_size": 4, "max_length": 256, "loss_eval_rows": 16,
               "learning_rate": 3e-4})
    [r] = report.rounds
    model_dir = out / "round-1" / "model"
    assert r.model_out == str(model_dir.resolve())

    # Data: verified rows (plus gold fallback rows if the model solved too little).
    rows = read_rows(out / "round-1" / "sft.jsonl", "sft")
    assert len(rows) == r.build.sft_rows >= 8
    own = [x for x in rows if x.metadata.verifier != "gold"]
    assert len(own) == r.build.sft_rows - r.gold_rows
    for x in own:
        assert x.metadata.source_run.endswith("sample") and x.metadata.model == DEFAULT_MODEL

    # Training: 3 steps; the loss on the training rows went down.
    rec = read_train_record(model_dir)
    assert rec.sft.steps == 3 and len(rec.sft.losses) == 3
    assert rec.config.threads is None and 1 <= rec.threads <= len(os.sched_getaffinity(0))
    assert r.loss_before is not None and r.loss_after is not None
    assert r.loss_after < r.loss_before, (r.loss_before, r.loss_after)

    # The merged checkpoint's weights differ from the base in the LoRA-targeted layers only.
    base = load_file(f"{resolve_model(DEFAULT_MODEL)}/model.safetensors")
    new = load_file(str(model_dir / "model.safetensors"))
    assert set(base) == set(new)
    changed = {k for k in base if not (new[k].float() == base[k].float()).all()}
    linear = {k for k in base if k.endswith("proj.weight")}  # what all-linear LoRA targets
    assert changed == linear, sorted(changed ^ linear)[:5]
    key = "model.layers.0.self_attn.q_proj.weight"
    assert (new[key].float() - base[key].float()).abs().max().item() < 0.5  # a nudge, not noise

    # vLLM loaded the merged checkpoint and answered every held-out problem.
    results = [json.loads(x) for x in
               (out / "round-1" / "eval" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 8
    assert all(x["model"] == r.model_out and x["error"] is None for x in results)
    assert all(x["text"].strip() for x in results)
    assert r.accuracy_after.n == 8 and r.accuracy_before.n == 8
    assert "| 1 |" in (out / "loop.md").read_text()
