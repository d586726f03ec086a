"""Early exit (DEER): a thinking model stops thinking once a trial answer is confident."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from refinery.engine.backends.base import require_continuation
from refinery.engine.context import Context
from refinery.engine.early_exit import ANSWER_LEAD, BOUNDARIES, EarlyExitMonitor, EarlyExitRule
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import Strategy, StrategyParams, continue_turn
from refinery.strategies.cot import CoT
from refinery.strategies.force_thinking import (
    THINK_END,
    answer_part,
    extended,
    inner_messages,
    raw_text,
    thinking_params,
    write_on,
)
from refinery.strategies.spec import ChildCost
from refinery.verifiers.math import extract_answer


class EarlyExit(Strategy):
    """``early_exit(cot, threshold=0.9, repeats=2)``: stop thinking when the answer is sure.

    The inner strategy's conversation is sampled with the reasoning ``boundaries``
    (``|``-separated: "Wait", "Alternatively", a blank line) as stop strings. At
    each boundary inside the thinking, a trial answer is written on a side branch:
    the partial turn, the end-of-thinking tag and ``lead`` (``The answer is
    \\boxed{``), continued greedily for at most ``trial_tokens`` tokens with
    logprobs (the backend's prefix cache holds the turn). The rule
    (``engine/early_exit.py``) exits when the trial's mean token probability reaches
    ``threshold`` or the same trial answer came ``repeats`` times in a row: the
    sample then closes its thinking and answers. Else the thinking goes on with
    ``word`` written where it stopped (a backend drops the stop string, so which
    boundary it was is not known; DEER resumes its transition points with "Wait").
    After ``max_trials`` trials, or at the request's ``thinking_token_budget``, the
    boundaries stop nothing more: the model thinks to its end, or closes at the bound.

    The decision is no ``StopRule``: a trial answer is a generation, and a stop
    rule's monitor runs synchronously inside the stream loop. Each sample exits on
    its own, so ``sc(early_exit(cot), n=4)`` votes over samples that each stopped
    where they were sure. The attempt's text is the answer after the thinking.

    Sources: Yang et al. 2025, "Dynamic Early Exit in Reasoning Models" (DEER).

    Example:
        >>> attempt = await EarlyExit(CoT(), threshold=0.9).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["exit"], attempt.metadata["exit_at_tokens"]  # doctest: +SKIP
        ('confident', 57)
    """

    name = "early_exit"
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(StrategyParams):
        threshold: float = Field(0.9, gt=0.0, le=1.0, description="trial mean token "
                                 "probability that ends the thinking")
        repeats: int = Field(2, ge=0, le=64, description="same trial answer this many "
                             "times in a row ends the thinking (0: off)")
        boundaries: str = Field("|".join(BOUNDARIES), pattern=r"^[^|]+(\|[^|]+)*$",
                                description="where trials are made, |-separated")
        trial_tokens: int = Field(16, ge=1, le=256, description="tokens of a trial answer")
        lead: str = Field(ANSWER_LEAD, min_length=1, description="what a trial answer follows")
        word: str = Field("Wait", min_length=1, description="written where thinking resumes")
        max_trials: int = Field(16, ge=0, le=64, description="trial answers at most")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return 2 * params.max_trials + 2  # each trial and the piece before it, then answers

    def messages(self, task: Task) -> list[Message]:
        return inner_messages(self.inner[0], task)

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        require_continuation(ctx.backend)
        p = self.params
        rule = EarlyExitRule(p.threshold, p.repeats, tuple(p.boundaries.split("|")))
        monitor = rule.start()
        messages, budget = self.messages(task), ctx.params.thinking_token_budget
        text, events, spent, finish, exit_at = "", [], 0, "stop", None
        while True:
            watching = THINK_END not in text and len(monitor.trials) < p.max_trials
            params = thinking_params(ctx.params, rule.boundaries if watching else (), budget,
                                     spent)
            comp = await write_on(ctx, messages, text, params, strategy=self.name,
                                  events=events)
            if comp is None:
                break  # the budget ran out: what was written stands
            was_thinking = THINK_END not in text
            text, finish = extended(text, comp), comp.finish_reason
            spent += comp.completion_tokens if was_thinking else 0
            if not watching or finish != "stop":
                break  # it ran free to its end, or was cut
            if THINK_END in text:
                continue  # it closed its thinking itself: the answer goes on unwatched
            if budget is not None and spent >= budget:
                text += THINK_END  # the bound: answer from here
                continue
            trial = await self._trial(ctx, messages, text, monitor, events, spent)
            if trial is None:
                break
            if trial:
                text, exit_at = text + THINK_END, spent
            else:
                text = f"{text.rstrip()}\n{p.word}"
        answer = answer_part(text)
        last = monitor.trials[-1].exit if exit_at is not None else None
        return Attempt(text=answer, answer=extract_answer(answer), finish_reason=finish,
                       strategy=self.name, events=events,
                       metadata={"boundaries": len(monitor.trials), "exit": last,
                                 "exit_at_tokens": exit_at, "thinking_tokens": spent,
                                 "thinking": text[: len(text) - len(answer)],
                                 **monitor.measures()})

    async def _trial(self, ctx: Context, messages: list[Message], text: str,
                     monitor: EarlyExitMonitor, events: list[str], spent: int) -> bool | None:
        """One trial answer at a boundary, judged: whether to exit (None: no budget)."""
        params = ctx.params.but(temperature=0.0, n=1, max_tokens=self.params.trial_tokens,
                                stop=["}"], logprobs=True, top_logprobs=0, constraint=None,
                                thinking_token_budget=None)
        gen = await continue_turn(ctx, messages, f"{text}{THINK_END}{self.params.lead}",
                                  params, strategy=self.name, parents=events[-1:])
        if gen is None:
            return None
        [comp] = gen
        trial = monitor.observe(raw_text(comp, thinking=True), comp.token_logprobs)
        ctx.emit("threshold", trial.text, strategy=self.name, parents=[gen.event_id],
                 confidence=trial.confidence, decision=trial.exit or "continue",
                 at_tokens=spent)
        return trial.exit is not None
