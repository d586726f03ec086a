"""Agent frameworks, unchanged, through the official clients against a real server on
the real engine: the OpenAI Agents SDK's tool loop (Responses and chat-completions
models, plain and under a strategy) and LangChain's ``bind_tools``.

The frameworks run in their own virtualenv (``make agent-clients``; they pin openai
and pydantic on their own schedule), as a user's program would, against the server
over loopback. At 135M the embedded model rarely chooses a call on its own under
``"auto"`` (docs/results.md, Tool calls), so the loop that must reach the tool's
result asks for ``"required"``, which the SDK resets to its default after the first
call: the turn with the tool's result is then an ``"auto"`` turn.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

HOME = Path(os.environ.get("REFINERY_HOME", Path.home() / ".cache" / "refinery"))
PYTHON = HOME / "peers" / "agents" / "bin" / "python"
CLIENT = Path(__file__).with_name("agent_client.py")
MODEL = "smollm2-135m"


async def run_flow(server_url: str, flow: str, model: str = MODEL) -> dict:
    """The framework's JSON; the server runs in this event loop, so the client program
    is awaited, never waited for."""
    if not PYTHON.exists():
        pytest.fail(f"the agent frameworks' virtualenv is missing ({PYTHON}): make agent-clients")
    proc = await asyncio.create_subprocess_exec(
        str(PYTHON), str(CLIENT), server_url + "/v1", model, flow,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 840)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_the_agents_sdk_reaches_the_tools_result(server_url, api):
    out = await run_flow(server_url, f"agents-{api}-required")
    assert out["items"][:2] == ["ToolCallItem", "ToolCallOutputItem"]
    assert out["outputs"] == ["Today's secret word is PELICAN."]
    assert out["items"][-1] == "MessageOutputItem" and out["final"]


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_the_agents_sdk_with_every_default_ends_its_loop(server_url, api):
    out = await run_flow(server_url, f"agents-{api}")
    if out.get("incomplete"):
        # The model wrote past the SDK's cap: a Responses answer then ends "incomplete",
        # as OpenAI's does, and the SDK stops the run (on chat it is finish "length").
        assert api == "responses" and out["incomplete"] == "max_output_tokens"
        return
    assert out["items"][-1] == "MessageOutputItem" and out["final"]
    calls = out["items"].count("ToolCallItem")
    assert out["items"].count("ToolCallOutputItem") == calls
    assert out["outputs"] == ["Today's secret word is PELICAN."] * calls


async def test_the_agents_sdk_under_a_strategy(server_url):
    out = await run_flow(server_url, "agents-responses-required", model=f"sc(cot, n=3)@{MODEL}")
    # the strategy's samples arrive as a reasoning item before each answer
    items = [i for i in out["items"] if i != "ReasoningItem"]
    assert items[:2] == ["ToolCallItem", "ToolCallOutputItem"]
    assert out["outputs"] == ["Today's secret word is PELICAN."]
    assert items[-1] == "MessageOutputItem" and out["final"]


async def test_langchain_bind_tools_with_the_default_choice(server_url):
    out = await run_flow(server_url, "langchain")
    assert isinstance(out["content"], str)
    assert all(c["name"] == "get_secret_word" and c["args"] == {} for c in out["tool_calls"])
    assert bool(out["tool_calls"]) != bool(out["content"])  # text or calls, never half of each
