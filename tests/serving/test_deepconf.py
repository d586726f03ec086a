"""deepconf served: SPEC@MODEL, the preset, steps and stops streamed as reasoning,
and a confidence stop reported to clients as ``length``."""

from __future__ import annotations

import pytest

from refinery.serving.endpoints import public_finish
from tests.serving.conftest import CHAT, MODEL, chat, sse_data
from tests.strategies.test_deepconf import Traces, steady

pytestmark = pytest.mark.timeout(60)

SPEC = "deepconf(cot, n=5, warmup=3, eta=50.0, batch=1, top_k=4, window=4, consensus=0.99)"


def late_drop() -> tuple[str, list[float]]:
    return "4", [9.0] * 5 + [1.0] * 20  # stopped at its 7th token (windows of 4)


async def test_streamed_deepconf_shows_threshold_stops_and_votes(scripted_serve, client):
    traces = Traces(steady("4", 6.0), steady("5", 7.0), steady("4", 8.0), late_drop(),
                    steady("4", 9.0))
    url, _ = await scripted_serve(backend=traces.backend())
    r = await client.post(url + CHAT, json=chat(model=f"{SPEC}@{MODEL}", stream=True,
                                                stream_options={"include_usage": True}))
    chunks = [c for c in sse_data(r.text) if c != "[DONE]"]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    reasoning = "".join(d["delta"].get("reasoning_content") or "" for d in deltas)
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    assert "[deepconf · threshold] stop below 7.000" in reasoning
    assert "(confidence 6.00, 7.00, 8.00)" in reasoning  # the warm-up's three traces
    assert "stopped at token 7" in reasoning and "[deepconf · vote]" in reasoning
    assert content.startswith("te") and content.endswith("\\boxed{4}")
    assert deltas[-1]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 3 * 12 + 7 + 12


async def test_the_preset_and_a_confidence_stop_reaching_the_client(scripted_serve, client):
    # The warm-up trace has no answer; the only answer is in a trace stopped early,
    # which votes only because nothing else can: its finish reaches the client as length.
    traces = Traces(("", [7.0] * 12), ("9", [9.0] * 5 + [1.0] * 20, True))
    url, _ = await scripted_serve(backend=traces.backend())
    body = chat(model=f"deepconf(cot, n=2, warmup=1, top_k=4, window=4)@{MODEL}")
    r = (await client.post(url + CHAT, json=body)).json()
    [choice] = r["choices"]
    assert choice["message"]["content"] == "tb \\boxed{9} ww ww ww ww ww"  # cut at token 7
    assert choice["finish_reason"] == "length"
    presets = (await client.get(url + "/v1/models")).json()["data"]
    assert any(m["id"] == f"deepconf@{MODEL}" for m in presets)
    assert public_finish("confidence") == "length" and public_finish("loop") == "loop"
