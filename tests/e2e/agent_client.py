"""Agent frameworks as their users run them against a server, unchanged: run by the
agent-clients virtualenv's Python (``make agent-clients``), never imported by pytest.

    python agent_client.py BASE_URL MODEL FLOW

FLOW is ``agents-responses`` or ``agents-chat`` (the OpenAI Agents SDK, one agent with
one ``@function_tool``, every setting at its default), the same with ``-required``
appended (``tool_choice="required"``, which the SDK resets after the first call, its
default), or ``langchain`` (``bind_tools`` with the default choice). Prints one JSON
object: what the framework returned.
"""

from __future__ import annotations

import asyncio
import json
import sys

SECRET = "PELICAN"
QUESTION = "Call get_secret_word, then tell me today's secret word."
MAX_TOKENS = 256


def get_secret_word() -> str:
    """Returns today's secret word."""
    return f"Today's secret word is {SECRET}."


async def agents_flow(base_url: str, model: str, api: str, required: bool) -> dict:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.exceptions import ModelBehaviorError
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    served = (OpenAIResponsesModel(model, client) if api == "responses"
              else OpenAIChatCompletionsModel(model, client))
    # short answers keep the test's time bounded; the tool settings stay the SDK's own
    settings = ModelSettings(max_tokens=MAX_TOKENS,
                             **({"tool_choice": "required"} if required else {}))
    agent = Agent(name="assistant", instructions="You answer with the tools you have.",
                  tools=[function_tool(get_secret_word)], model=served,
                  model_settings=settings)
    try:
        result = await Runner.run(agent, QUESTION, max_turns=4)
    except ModelBehaviorError as exc:  # the Responses answer ran past max_output_tokens
        if "max_output_tokens" not in str(exc):
            raise
        return {"final": "", "items": [], "outputs": [], "incomplete": "max_output_tokens"}
    return {"final": str(result.final_output),
            "items": [type(item).__name__ for item in result.new_items],
            "outputs": [str(getattr(item, "output", "")) for item in result.new_items
                        if type(item).__name__ == "ToolCallOutputItem"]}


def langchain_flow(base_url: str, model: str) -> dict:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base_url, api_key="none", model=model, max_retries=0,
                     max_tokens=MAX_TOKENS)
    bound = llm.bind_tools([tool(get_secret_word)])
    message = bound.invoke(QUESTION)
    return {"content": message.content,
            "tool_calls": [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]}


def main() -> None:
    base_url, model, flow = sys.argv[1:4]
    if flow == "langchain":
        out = langchain_flow(base_url, model)
    else:
        api, _, required = flow.removeprefix("agents-").partition("-")
        out = asyncio.run(agents_flow(base_url, model, api, required == "required"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
