"""The Strategy base class and the one sample -> score -> select -> stop loop.

A strategy is an object with a ``name``, validated ``params`` and inner
strategies, and ``async solve(task, ctx) -> Attempt``. Everything that
belongs to one call (candidates, scores, rounds) lives in locals or is passed
as arguments, never on ``self``: one strategy object solves many tasks at once.

:class:`LoopStrategy` is the shared loop. A subclass says how to ``propose``
candidates for a round, how to ``score`` them, when to ``stop``, and whether
to keep the best-scored or the last candidate; the loop does the rounds, the
budget (a spent budget returns the best candidate so far) and the ``select``
trace event.

Example:
    >>> class Twice(LoopStrategy):
    ...     name = "twice"
    ...     def rounds(self): return 2
    ...     async def propose(self, task, ctx, rnd, last):
    ...         return [await self.inner[0].solve(task, ctx.inner())]
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from refinery.engine.constraints import Constraint, structured_mode
from refinery.engine.context import Context, Generation
from refinery.engine.errors import BudgetExhausted, RefineryError, SpecError
from refinery.engine.types import Attempt, Completion, Message, SamplingParams, Task
from refinery.strategies.spec import (
    ChildCost,
    check_inner_count,
    format_call,
    non_default,
    validate_params,
)
from refinery.verifiers.math import extract_answer

Keep = Literal["best", "last"]


def exc_message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, RefineryError) else str(exc)


class StrategyParams(BaseModel):
    """Base of every strategy's Params: strict types, unknown names refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class StructuredParams(StrategyParams):
    """Params of a strategy with parsed steps (their output is read, not just shown)."""

    structured: bool | None = Field(
        None, description="constrain the output of parsed steps: None = when the backend "
                          "enforces the kinds needed, True = always (an error without "
                          "support), False = free text")


class SampledParams(StrategyParams):
    """Params of a strategy that draws ``n`` samples of its inner one (sc, best_of_n)."""

    n: int = Field(8, ge=1, le=64, description="samples")
    temperature: float = Field(0.7, ge=0.0, le=2.0,
                               description="temperature the samples are drawn at")


S = TypeVar("S", bound="Strategy")


class Strategy:
    """Base class: ``Strategy(*inner, **params)``.

    Subclasses set ``name``, a nested ``Params`` model (the paper's defaults),
    how many inner strategies they take and the classes of their default inner
    strategies, and a ``worst_case`` call count used by the graph to bound cost.
    The class is what the registry maps a spec name to: the spec language reads
    all of this off it.

    Checking is done once per path, by the same functions of
    :mod:`refinery.strategies.spec` (so the messages are the same): a spec is
    checked by the graph, which builds each node with :meth:`from_validated`;
    Python construction (``SelfConsistency(CoT(), n=4)``) is checked here.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type[StrategyParams]] = StrategyParams
    min_inner: ClassVar[int] = 0
    max_inner: ClassVar[int | None] = 0
    # Built with their own defaults when no inner strategy is given; the graph
    # grafts them by name, so each must be a registered strategy class.
    default_inner: ClassVar[tuple[type[Strategy], ...]] = ()
    # n attempts of it are one request with n samples (cot's ``sample``): see ChildCost.
    samples_in_one_request: ClassVar[bool] = False
    # Constraint kinds the parsed steps ask for in structured mode (see ``structured``).
    structured_kinds: ClassVar[frozenset[str]] = frozenset()
    # Whether it can solve a turn whose answer may be a tool call (registry.tool_turn_form).
    tool_turns: ClassVar[bool] = False

    def __init__(self, *inner: Strategy, **params: Any) -> None:
        if not inner:
            inner = tuple(cls() for cls in self.default_inner)
        check_inner_count(self.name, self.min_inner, self.max_inner, len(inner))
        for s in inner:
            if not callable(getattr(s, "solve", None)):
                raise SpecError(f"inner strategies of {self.name} must have solve(), got {s!r}")
        self.inner: tuple[Strategy, ...] = tuple(inner)
        self.params = validate_params(self.name, self.Params, params)

    @classmethod
    def from_validated(cls: type[S], inner: Sequence[Strategy], params: StrategyParams) -> S:
        """The strategy of a graph node: :func:`~refinery.strategies.spec.validate` already
        checked ``params`` and the number of ``inner`` strategies, so nothing is redone."""
        strategy = cls.__new__(cls)
        strategy.inner = tuple(inner)
        strategy.params = params
        return strategy

    @staticmethod
    def worst_case(params: Any, children: Sequence[ChildCost]) -> int:
        """Most model requests one ``solve`` can make, given the children's worst cases."""
        return 1

    def structured(self, ctx: Context) -> bool:
        """Whether this solve's parsed steps ask for constrained output, per the
        ``structured`` parameter and what ``ctx.backend`` enforces.

        Raises:
            StructuredModeError: ``structured=True`` on a backend lacking a needed kind.
        """
        wanted = getattr(self.params, "structured", False)
        return structured_mode(self.name, wanted, self.structured_kinds, ctx.backend)

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        raise NotImplementedError

    def __repr__(self) -> str:
        return format_call(self.name, [repr(s) for s in self.inner], non_default(self.params))


# --------------------------------------------------------------------------- the loop


@runtime_checkable
class Sampler(Protocol):
    """A strategy that draws ``n`` attempts from one request with ``n`` samples
    (cot and its variants, pot): ``sc``, ``best_of_n`` and ``moa`` call ``sample``
    instead of ``n`` solves, so the samples share one prompt prefix in the engine."""

    async def sample(self, task: Task, ctx: Context, n: int, *,
                     temperature: float | None = None,
                     logprobs: bool = False) -> list[Attempt]: ...


class Detail(BaseModel):
    """What a strategy's ``score`` step learnt about a candidate, typed per strategy.

    It is handed to the strategy's later steps (``propose``, ``stop``) and, for
    the chosen candidate, its non-None fields become the result's metadata.
    """

    model_config = ConfigDict(frozen=True)

    def metadata(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


D = TypeVar("D", bound=Detail)


@dataclass
class Scored(Generic[D]):
    """A candidate with its score in [0, 1] (``None``: not scored, e.g. the budget ran
    out first), a tie-break key (compared after the score, higher wins), the trace
    events of its scoring and the strategy's typed :class:`Detail` (``None``: none)."""

    attempt: Attempt
    score: float | None = None
    tiebreak: tuple = ()
    events: list[str] = field(default_factory=list)
    detail: D | None = None


class PartialAttempts(BudgetExhausted):
    """The budget ran out while inner strategies ran; ``attempts`` are those that finished."""

    def __init__(self, spent: BudgetExhausted, attempts: Sequence[Attempt]) -> None:
        super().__init__(exc_message(spent))
        self.attempts: list[Attempt] = list(attempts)


class PartialScores(BudgetExhausted):
    """The budget ran out while scoring; ``scored`` holds every candidate (those not
    scored in time with ``score=None``)."""

    def __init__(self, spent: BudgetExhausted, scored: Sequence[Scored]) -> None:
        super().__init__(exc_message(spent))
        self.scored: list[Scored] = list(scored)


class LoopStrategy(Strategy):
    """The shared loop: for each round, propose -> score -> stop?; then select.

    ``keep="best"`` returns the highest (score, tiebreak), first seen on ties
    (unscored candidates rank below scored ones); ``keep="last"`` returns the
    last candidate. A ``BudgetExhausted`` in any phase ends the loop with the
    candidates so far (a :class:`PartialAttempts` or :class:`PartialScores`
    carries what the phase got); with no candidate at all it is re-raised.
    """

    keep: ClassVar[Keep] = "best"

    def rounds(self) -> int:
        return 1

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Scored]) -> list[Attempt]:
        raise NotImplementedError

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Scored]:
        return [Scored(a) for a in cands]

    def stop(self, rnd: int, last: list[Scored], pool: list[Scored]) -> str | None:
        """A reason to stop after round ``rnd``, or None to go on."""
        return None

    def select(self, pool: list[Scored]) -> Scored:
        if self.keep == "last":
            return pool[-1]
        ranked = sorted(enumerate(pool), key=lambda p: (
            p[1].score is not None, p[1].score or 0.0, *p[1].tiebreak, -p[0]))
        return ranked[-1][1]

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        self.structured(ctx)  # structured=True on a backend without support: fail first
        pool: list[Scored] = []
        last: list[Scored] = []
        stopped, exhausted, rnd = "rounds", None, 0
        for rnd in range(self.rounds()):
            try:
                cands = await self.propose(task, ctx, rnd, last)
            except BudgetExhausted as exc:
                exhausted = exc
                cands = exc.attempts if isinstance(exc, PartialAttempts) else []
            if not cands:
                break
            try:
                last = await self.score(task, ctx, cands)
            except BudgetExhausted as exc:
                exhausted = exhausted or exc
                last = (exc.scored if isinstance(exc, PartialScores)
                        else [Scored(a) for a in cands])
            pool.extend(last)
            if exhausted is not None:
                break
            reason = self.stop(rnd, last, pool)
            if reason:
                stopped = reason
                break
        if not pool:
            if exhausted is not None:
                raise exhausted
            raise RefineryError(f"{self.name} produced no candidate")
        chosen = self.select(pool)
        detail = chosen.detail.metadata() if chosen.detail is not None else {}
        meta: dict[str, Any] = {**detail, "rounds": rnd + 1, "candidates": len(pool),
                                "stopped": "budget" if exhausted is not None else stopped}
        if exhausted is not None:
            meta["budget_exhausted"] = exc_message(exhausted)
        elif "budget_exhausted" in chosen.attempt.metadata:  # an inner strategy ran out
            meta["budget_exhausted"] = chosen.attempt.metadata["budget_exhausted"]
        eid = ctx.emit("select", chosen.attempt.answer or "", strategy=self.name,
                       parents=dedupe([*chosen.attempt.events, *chosen.events]),
                       score=chosen.score, stopped=meta["stopped"], candidates=len(pool))
        return chosen.attempt.model_copy(update={
            "strategy": self.name, "score": chosen.score, "events": [eid], "metadata": meta})


# ----------------------------------------------------------------------------- helpers


async def gather_attempts(coros: Iterable[Awaitable[Attempt]]) -> list[Attempt]:
    """Run inner solves concurrently; keep what finished if the budget ran out.

    Raises:
        PartialAttempts: some runs hit the budget (``.attempts`` = the others).
    """
    results = await asyncio.gather(*coros, return_exceptions=True)
    done = [r for r in results if isinstance(r, Attempt)]
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, BudgetExhausted):
            raise r
    spent = next((r for r in results if isinstance(r, BudgetExhausted)), None)
    if spent is not None:
        raise PartialAttempts(spent, done)
    return done


def attempt_from(comp: Completion, *, strategy: str, events: Sequence[str],
                 text: str | None = None, **metadata: Any) -> Attempt:
    """An Attempt for a completion (``text`` overrides the completion's text); what the
    call's stop rules measured, if anything, is ``metadata["measures"]``."""
    body = comp.text if text is None else text
    measured = {"measures": comp.measures} if comp.measures is not None else {}
    return Attempt(text=body, answer=extract_answer(body), finish_reason=comp.finish_reason,
                   strategy=strategy, events=list(events),
                   metadata={"logprob": comp.logprob, "tokens": comp.completion_tokens,
                             **measured, **metadata})


def with_question(messages: Sequence[Message], suffix: str) -> list[Message]:
    """The conversation with ``suffix`` appended to its last user turn."""
    msgs = list(messages)
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role == "user":
            msgs[i] = Message(role="user", content=f"{msgs[i].content}\n\n{suffix}")
            return msgs
    return [*msgs, Message(role="user", content=suffix)]


def with_note(task: Task, note: str) -> Task:
    """The task with extra context (a plan, a hint) added to its question."""
    return task.model_copy(update={"messages": with_question(task.messages, note)})


def step_params(ctx: Context, constraint: Constraint | None, **changes: Any) -> SamplingParams:
    """The params of a parsed step: the task's, with the step's own constraint (None on
    the free-text path, so a constraint meant for the answer never shapes a step).

    A bounded constraint raises ``max_tokens`` to what its longest text needs: a
    sample cut at ``max_tokens`` is not in the constrained shape. On arith, 11 of
    566 SSR re-solves looped in 1-2 character tokens to a 256-token cap before
    their 400 characters of reasoning ran out.
    """
    params = ctx.params.but(constraint=constraint, **changes)
    bound = constraint.max_chars if constraint is not None else None
    if bound is not None and params.max_tokens <= bound:
        params = params.but(max_tokens=bound + 1)
    return params


def record_parse(ctx: Context, event_id: str, step: str, parsed: Sequence[bool], *,
                 structured: bool) -> None:
    """Note on a generation's trace event whether each of its samples parsed.

    ``data["parse"] = {"step", "parsed": [bool per sample], "structured"}``: what
    ``scripts/parse_rates.py`` counts, per strategy and step, from a run's traces.
    """
    for event in reversed(ctx.trace.events):
        if event.id == event_id:
            event.data["parse"] = {"step": step, "parsed": [bool(p) for p in parsed],
                                   "structured": structured}
            return


def dedupe(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in ids if i))


async def continue_turn(ctx: Context, messages: Sequence[Message], text: str,
                        params: SamplingParams, *, strategy: str,
                        parents: Sequence[str]) -> Generation | None:
    """One generation that goes on from the assistant's partial turn ``text`` (a
    first draft when it is empty), as ``tir`` and ``force_thinking`` write a turn in
    pieces. None when the budget runs out after something was written: what was
    written stands. Raises BudgetExhausted when nothing was.
    """
    turn = [*messages, Message(role="assistant", content=text)] if text else list(messages)
    try:
        return await ctx.generate(turn, params, step="continue" if text else "draft",
                                  strategy=strategy, parents=parents,
                                  continue_final=bool(text))
    except BudgetExhausted:
        if not text:
            raise
        return None
