"""``reasoning_effort`` (chat, completions) and ``reasoning.effort`` (responses): each
level runs the strategy the server maps it to, with its token budget; a strategy the
request names wins; /v1/models lists the mapping."""

from __future__ import annotations

import pytest

from refinery.serving import ServerConfig
from refinery.serving.config import DEFAULT_EFFORT, EffortLevel, effort_levels
from tests.serving.conftest import CHAT, COMPLETIONS, MODEL, assert_openai_error, chat, scripted

pytestmark = pytest.mark.timeout(60)
RESPONSES = "/v1/responses"


async def strategy_of(client, url: str, path: str, **fields) -> str | None:
    body = ({"model": MODEL, "input": "2+2?"} if path == RESPONSES else
            {"model": MODEL, "prompt": "2+2?"} if path == COMPLETIONS else chat())
    r = await client.post(url + path, json={**body, **fields})
    assert r.status_code == 200, r.text
    return r.json()["refinery"].get("strategy")  # absent: passthrough


@pytest.mark.parametrize("level,spec", [("none", None), ("minimal", None), ("low", "cot"),
                                        ("medium", "sc(cot, n=5)"),
                                        ("high", "sc(cot, n=16)")])
async def test_each_level_runs_its_strategy_on_every_endpoint(scripted_serve, client, level,
                                                             spec):
    url, _ = await scripted_serve()
    assert await strategy_of(client, url, CHAT, reasoning_effort=level) == spec
    assert await strategy_of(client, url, COMPLETIONS, reasoning_effort=level) == spec
    assert await strategy_of(client, url, RESPONSES, reasoning={"effort": level}) == spec


async def test_a_named_strategy_wins_over_the_effort(scripted_serve, client):
    url, _ = await scripted_serve(ServerConfig(default_strategy="cot"))
    assert await strategy_of(client, url, CHAT, model=f"sc(cot, n=2)@{MODEL}",
                             reasoning_effort="high") == "sc(cot, n=2)"
    assert await strategy_of(client, url, CHAT, refinery={"strategy": "re2"},
                             reasoning_effort="high") == "re2"
    assert await strategy_of(client, url, CHAT, model=f"none-{MODEL}",
                             reasoning_effort="high") is None  # OptiLLM's passthrough
    # The effort wins over the server's default strategy, which plain names get.
    assert await strategy_of(client, url, CHAT, reasoning_effort="minimal") is None
    assert await strategy_of(client, url, CHAT) == "cot"


async def test_a_level_runs_with_its_token_budget(scripted_serve, client):
    backend = scripted()
    config = ServerConfig(effort={"low": EffortLevel("sc(cot, n=4)", max_tokens=5)})
    url, _ = await scripted_serve(config, backend=backend)
    r = await client.post(url + CHAT, json=chat(reasoning_effort="low"))
    assert r.status_code == 400
    assert assert_openai_error(r.json())["type"] == "budget_exhausted"
    # The request's own budget is the request's to set.
    r = await client.post(url + CHAT, json=chat(reasoning_effort="low",
                                                refinery={"budget": {"max_tokens": 5000}}))
    assert r.status_code == 200, r.text
    assert r.json()["refinery"]["calls"] == 1


async def test_an_unmapped_level_is_refused(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(ServerConfig(effort={"low": EffortLevel("cot")}),
                                  backend=backend)
    r = await client.post(url + CHAT, json=chat(reasoning_effort="high"))
    assert r.status_code == 400
    err = assert_openai_error(r.json())
    assert err["param"] == "reasoning_effort" and "mapped: low" in err["message"]
    assert backend.calls == []


async def test_models_lists_the_mapping(scripted_serve, client):
    url, _ = await scripted_serve()
    cards = (await client.get(url + "/v1/models")).json()["data"]
    served = next(c for c in cards if c["id"] == MODEL)
    assert served["reasoning_effort"] == {k: v.spec for k, v in DEFAULT_EFFORT.items()}


def test_overrides_keep_the_level_budget_and_refuse_unknown_levels():
    levels = effort_levels(["high=sc(pot, n=8)", "low=passthrough"])
    assert levels["high"] == EffortLevel("sc(pot, n=8)", DEFAULT_EFFORT["high"].max_tokens)
    assert levels["low"].spec is None and levels["medium"] == DEFAULT_EFFORT["medium"]
    with pytest.raises(ValueError, match="LEVEL one of none, minimal"):
        effort_levels(["xhigh=cot"])
    with pytest.raises(ValueError, match="expected LEVEL=SPEC"):
        effort_levels(["high"])


async def test_thinking_token_budget_reaches_every_generation(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(thinking_token_budget=64,
                                                refinery={"strategy": "sc(cot, n=2)"}))
    assert r.status_code == 200, r.text
    assert [c.params.thinking_token_budget for c in backend.calls] == [64] * len(backend.calls)
    r = await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "2+2?",
                                                   "thinking_token_budget": -1})
    assert r.status_code == 400
    assert assert_openai_error(r.json())["param"] == "thinking_token_budget"
