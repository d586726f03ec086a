"""Budget forcing: a thinking model thinks at least ``min_tokens`` before it answers."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from refinery.engine.backends.base import require_continuation
from refinery.engine.context import Context
from refinery.engine.types import Attempt, Completion, Message, SamplingParams, Task
from refinery.strategies.base import Strategy, StrategyParams, continue_turn
from refinery.strategies.cot import CoT
from refinery.strategies.spec import ChildCost
from refinery.verifiers.math import extract_answer

THINK_START, THINK_END = "<think>", "</think>"


def raw_text(comp: Completion, thinking: bool = False) -> str:
    """What the model wrote, thinking included, whether or not the backend split it off
    (``thinking``: it continues a text whose thinking is open, so no start tag).

    Example:
        >>> raw_text(Completion(text="4", reasoning="2+2", prompt_tokens=1,
        ...                     completion_tokens=3, finish_reason="stop"))
        '<think>2+2</think>4'
    """
    if comp.reasoning is None:
        return comp.text
    start = "" if thinking else THINK_START
    return f"{start}{comp.reasoning}{THINK_END if comp.text else ''}{comp.text}"


def answer_part(text: str) -> str:
    """The text after the end of thinking (all of it when the model never closed it)."""
    return text.rpartition(THINK_END)[2] if THINK_END in text else text


def extended(text: str, comp: Completion) -> str:
    """The partial turn ``text`` with the continuation ``comp`` written on.

    Only a first draft gets the start tag: a continuation goes on from a turn that
    holds it already, and a reasoning parser that reads text without an end tag as
    all thinking (``deepseek_r1``) must not make an answer written after a closed
    thinking look like a second one.

        >>> extended("<think>2+2</think>", Completion(text="", reasoning="4",
        ...          prompt_tokens=1, completion_tokens=1, finish_reason="stop"))
        '<think>2+2</think>4'
    """
    return text + raw_text(comp, thinking=bool(text))


def inner_messages(inner: Strategy, task: Task) -> list[Message]:
    """The conversation ``inner`` would sample (its ``messages(task)``; the task's own
    for a strategy without), for a strategy that writes the turn itself."""
    messages = getattr(inner, "messages", None)
    return messages(task) if callable(messages) else list(task.messages)


async def write_on(ctx: Context, messages: Sequence[Message], text: str,
                   params: SamplingParams, *, strategy: str,
                   events: list[str]) -> Completion | None:
    """One continuation of the partial turn ``text`` (``continue_turn``), its event
    appended to ``events``; None when the budget ran out (what was written stands)."""
    gen = await continue_turn(ctx, messages, text, params, strategy=strategy,
                              parents=events[-1:])
    if gen is None:
        return None
    events.append(gen.event_id)
    return gen[0]


def thinking_params(params: SamplingParams, stops: Sequence[str], budget: int | None,
                    spent: int) -> SamplingParams:
    """``params`` with ``stops`` added and what is left of the thinking budget."""
    changes: dict = {"stop": [*params.stop, *stops]} if stops else {}
    if budget is not None:
        changes["thinking_token_budget"] = max(0, budget - spent)
    return params.but(**changes)


class ForceThinking(Strategy):
    """``force_thinking(cot, min_tokens=256, word="Wait")``: think at least ``min_tokens``.

    The inner strategy's conversation (its ``messages(task)``; the task's own for one
    without) is sampled with the end-of-thinking tag as a stop string. While fewer than
    ``min_tokens`` tokens are spent, a sample that stops there is continued as the same
    assistant turn with ``word`` appended where the tag would have been (the backend
    continues a partial assistant message), at most ``max_extensions`` times. Once the
    minimum is spent the tag is no stop any more: the model closes its thinking and
    answers in that call. The request's ``thinking_token_budget`` bounds the thinking
    from above: each continuation gets what is left of it, and at the bound no word is
    appended. The attempt's text is the answer after the thinking.

    Sources: Muennighoff et al. 2025, "s1: Simple test-time scaling" (budget forcing).

    Example:
        >>> attempt = await ForceThinking(CoT(), min_tokens=64).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["extensions"], attempt.metadata["thinking_tokens"]  # doctest: +SKIP
        (2, 71)
    """

    name = "force_thinking"
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(StrategyParams):
        min_tokens: int = Field(256, ge=1, description="thinking tokens spent before answering")
        word: str = Field("Wait", min_length=1, description="appended where thinking ended")
        max_extensions: int = Field(8, ge=0, le=64, description="words appended at most")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return 1 + params.max_extensions

    def messages(self, task: Task) -> list[Message]:
        return inner_messages(self.inner[0], task)

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        require_continuation(ctx.backend)
        messages, budget = self.messages(task), ctx.params.thinking_token_budget
        text, events, spent, extensions, finish = "", [], 0, 0, "stop"
        forcing = True
        while True:
            params = thinking_params(ctx.params, [THINK_END] if forcing else [], budget, spent)
            comp = await write_on(ctx, messages, text, params, strategy=self.name,
                                  events=events)
            if comp is None:
                break  # the budget ran out: what was written stands
            text, finish = extended(text, comp), comp.finish_reason
            if not forcing or finish != "stop":
                break  # it ran free to its end, or was cut
            spent += comp.completion_tokens
            if self._extend(spent, extensions, budget):
                text = f"{text.rstrip()}\n{self.params.word}"
                extensions += 1
            else:
                text += THINK_END  # the minimum or the bound is reached: answer from here
                forcing = False
        answer = answer_part(text)
        return Attempt(text=answer, answer=extract_answer(answer), finish_reason=finish,
                       strategy=self.name, events=events,
                       metadata={"extensions": extensions, "thinking_tokens": spent,
                                 "thinking": text[: len(text) - len(answer)]})

    def _extend(self, spent: int, extensions: int, budget: int | None) -> bool:
        return (spent < self.params.min_tokens and extensions < self.params.max_extensions
                and (budget is None or spent < budget))
