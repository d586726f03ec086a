"""Socratic self-refine building blocks, shared by ``ssr``, ``ssr_ada`` and ``ssr_plan``.

One assessment = decompose the trajectory into sub-question/answer pairs
(temperature 0, JSON, one retry showing the parse error, else empty) -> re-solve
every sub-question ``resolves`` times (all steps concurrently, one request with
n per step, answers in ``<answer>`` tags) -> confidence per step = the fraction
of re-solves equivalent to the original sub-answer. One refinement = either
the Socratic refine of the least confident step (with its majority re-solve
as the correction), or plain self-refine (holistic 0-5 judge, then rewrite)
when the decomposition is empty or every step is fully confident.

Structured mode (``structured``) keeps every prompt and call and adds
a constraint to each parsed step, so a small model cannot miss the format:

* decomposition: JSON under :func:`decomposition_schema` (the prompt's
  ``{"sub-questions": [{"description", "answer"}]}``, 1 to ``max_steps`` items,
  bounded strings);
* re-solves: the regex :data:`RESOLVE_FORM`, brief reasoning without ``<`` (at
  most ``RESOLVE_CHARS`` characters) then ``<answer>value</answer>``; the stop
  string goes, the regex ends the sample;
* agreement check: the regex of exactly the lines ``k: same|different``;
* holistic judge: :func:`~refinery.verifiers.judge.score_form`, one paragraph
  of explanation (the self-refine feedback) then ``Score: 0..5``.

Every regex is deterministic (the free part cannot contain what ends it) and
bounded. The same tolerant parsers read both paths; each parsed step notes on
its trace event whether it parsed (:func:`~refinery.strategies.base.record_parse`).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    Detail,
    Scored,
    attempt_from,
    dedupe,
    record_parse,
    step_params,
)
from refinery.strategies.parsing import after, parse_json_object, tag
from refinery.verifiers.judge import parse_score, score_form
from refinery.verifiers.math import extract_answer, is_equivalent, normalize_answer

DECOMPOSE = """Below are a problem and a worked solution. Rewrite the solution as a list \
of atomic sub-questions, each paired with the answer the solution gives to it.
Rules:
- each sub-question can be answered from the problem and the earlier sub-questions and \
answers alone;
- answers are exact values (keep fractions, never round decimals);
- the last sub-question is the one that derives the final answer.
Reply with JSON only, in exactly this shape:
{{"sub-questions": [{{"description": "...", "answer": "..."}}]}}

Problem:
{question}

Solution:
{solution}"""
RETRY = "That reply could not be read ({error}). Reply again with only the JSON object."
RESOLVE = """Problem:
{question}

Established so far:
{known}

Answer only this sub-question: {description}
Reason briefly, then give just the value inside <answer></answer>."""
AGREE = """Question: {description}
Reference answer: {original}
Candidate answers:
{numbered}
For each candidate write one line "k: same" if it means the same as the reference \
answer, else "k: different"."""
REFLECT = 'Wait, in the sub-step "{description}" I got {answer}, but re-checking it, {fix}.'
REEVALUATE = ("Re-evaluate your solution with that in mind, inside <evaluation></evaluation>. "
              "Then solve the problem again step by step, correcting that step, and give the "
              "final answer inside <answer></answer>.")
JUDGE = """Check this solution carefully.

Problem:
{question}

Solution:
{solution}

Explain briefly any mistake you find. Then rate the solution from 0 (wrong) to 5 (fully \
correct). End with a line "Score: N"."""
REWRITE = ("Feedback on your solution:\n{feedback}\n\nTaking it into account, solve the problem "
           "again step by step and give the final answer inside <answer></answer>.")
NEUTRAL_JUDGE = 2.5  # unreadable 0-5 judge score (ours): never "full marks"

# Structured mode: bounds of the constrained parts, in characters (a token writes >= 1).
DESCRIPTION_CHARS = 200  # a sub-question
ANSWER_CHARS = 60  # a sub-answer, in the decomposition and in a re-solve's tag
RESOLVE_CHARS = 400  # a re-solve's reasoning before its <answer> tag
RESOLVE_FORM = Constraint.from_regex(
    rf"[^<]{{0,{RESOLVE_CHARS}}}<answer>[^<\n]{{1,{ANSWER_CHARS}}}</answer>")
JUDGE_FORM = Constraint.from_regex(score_form(0, 5))


RefineMode = Literal["socratic", "self_refine"]


class SubQuestion(BaseModel):
    """One step of a decomposed trajectory, with the answer the trajectory gives it."""

    model_config = ConfigDict(frozen=True)

    description: str
    answer: str


class StepCheck(SubQuestion):
    """A sub-question after re-solving: how often the re-solves agree, and their majority."""

    resolves: list[str | None]
    confidence: float
    majority: str | None
    events: list[str]


class Judgement(BaseModel):
    """A holistic 0-5 judge reply (unreadable -> ``NEUTRAL_JUDGE``, ``readable=False``)."""

    model_config = ConfigDict(frozen=True)

    score: float
    readable: bool
    feedback: str
    event: str


class Assessment(Detail):
    """One trajectory's assessment; ``mode`` says how the next refinement goes.

    ``steps`` is None when no decomposition ran (ssr_ada below full marks);
    ``weakest`` indexes the least confident step when there are steps.
    """

    mode: RefineMode
    reason: str = ""
    judge: Judgement | None = None
    steps: list[StepCheck] | None = None
    weakest: int | None = None
    fully_confident: bool | None = None


@lru_cache(maxsize=64)
def decomposition_schema(max_steps: int) -> Constraint:
    """JSON of the shape DECOMPOSE shows: 1 to ``max_steps`` sub-questions, each
    a non-empty description and answer of bounded length, nothing else."""
    step = {"type": "object", "additionalProperties": False,
            "required": ["description", "answer"],
            "properties": {
                "description": {"type": "string", "minLength": 1,
                                "maxLength": DESCRIPTION_CHARS},
                "answer": {"type": "string", "minLength": 1, "maxLength": ANSWER_CHARS}}}
    schema = {"type": "object", "additionalProperties": False, "required": ["sub-questions"],
              "properties": {"sub-questions": {"type": "array", "items": step,
                                               "minItems": 1, "maxItems": max_steps}}}
    return Constraint.from_schema(schema, name="decomposition")


@lru_cache(maxsize=64)
def agreement_form(n: int) -> Constraint:
    """Exactly the lines ``1: same|different`` .. ``n: same|different``."""
    return Constraint.from_regex("\n".join(f"{k}: (?:same|different)"
                                           for k in range(1, n + 1)))


def _user(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


def parse_steps(text: str) -> list[SubQuestion]:
    """Sub-question/answer pairs from a decomposition reply.

    Raises:
        ValueError: not JSON, or not the expected shape (the message is shown to the model).
    """
    data = parse_json_object(text)
    items = data
    if isinstance(data, dict):
        key = next((k for k in ("sub-questions", "sub_questions", "subquestions", "steps")
                    if k in data), None)
        if key is None:
            raise ValueError('the object has no "sub-questions" list')
        items = data[key]
    if not isinstance(items, list):
        raise ValueError('"sub-questions" must be a list')
    steps = []
    for item in items:
        if isinstance(item, dict) and str(item.get("description") or "").strip():
            answer = item.get("answer")
            steps.append(SubQuestion(description=str(item["description"]).strip(),
                                     answer="" if answer is None else str(answer).strip()))
    return steps


async def decompose(task: Task, ctx: Context, attempt: Attempt, strategy: str,
                    max_steps: int, structured: bool = False,
                    ) -> tuple[list[SubQuestion], list[str], str]:
    """(steps, event ids, note): temperature 0, one retry with the error shown, else []."""
    msgs = _user(DECOMPOSE.format(question=task.question, solution=attempt.text))
    # Structured, the cap rises to the schema's longest compact text (step_params): a
    # decomposition that repeats "2. " until every string is full still closes its JSON.
    params = step_params(ctx, decomposition_schema(max_steps) if structured else None,
                         temperature=0.0)
    events: list[str] = []
    for step, note in (("decompose", ""), ("decompose_retry", "parsed on retry")):
        gen = await ctx.generate(msgs, params, n=1, step="decompose", strategy=strategy,
                                 parents=events or attempt.events)
        events.append(gen.event_id)
        try:
            steps = parse_steps(gen[0].text)[:max_steps]
        except ValueError as exc:
            error = exc
            record_parse(ctx, gen.event_id, step, [False], structured=structured)
            msgs = [*msgs, Message(role="assistant", content=gen[0].text),
                    *_user(RETRY.format(error=exc))]
            continue
        record_parse(ctx, gen.event_id, step, [bool(steps)], structured=structured)
        return steps, events, note
    return [], events, f"unparseable decomposition: {error}"


def _checkable(answer: str) -> bool:
    """Math equivalence / normalised match applies to numbers and short answers;
    longer free text goes to the judge."""
    norm = normalize_answer(answer)
    return any(ch.isdigit() for ch in norm) or len(norm.split()) <= 3


async def _agreement(ctx: Context, step: SubQuestion, resolves: list[str | None],
                     strategy: str, parents: list[str],
                     structured: bool) -> tuple[list[bool], list[str]]:
    original = step.answer
    if _checkable(original):
        same = await asyncio.gather(*(asyncio.to_thread(is_equivalent, original, r)
                                      for r in resolves if r is not None))
        it = iter(same)
        return [False if r is None else next(it) for r in resolves], []
    numbered = "\n".join(f"{k}: {r}" for k, r in enumerate(resolves, 1))
    prompt = AGREE.format(description=step.description, original=original, numbered=numbered)
    params = step_params(ctx, agreement_form(len(resolves)) if structured else None,
                         temperature=0.0)
    gen = await ctx.generate(_user(prompt), params, n=1, step="judge",
                             strategy=strategy, parents=parents)
    marks = dict(_parse_marks(gen[0].text))
    record_parse(ctx, gen.event_id, "agree",
                 [all(k in marks for k in range(1, len(resolves) + 1))], structured=structured)
    fallback = [r is not None and normalize_answer(r) == normalize_answer(original)
                for r in resolves]
    return [marks.get(k, fallback[k - 1]) for k in range(1, len(resolves) + 1)], [gen.event_id]


def _parse_marks(text: str) -> list[tuple[int, bool]]:
    return [(int(k), v.lower() == "same")
            for k, v in re.findall(r"(\d+)\s*[:.)\-]\s*(same|different)", text, re.I)]


async def check_step(task: Task, ctx: Context, steps: list[SubQuestion], t: int,
                     n: int, temperature: float, strategy: str,
                     parents: list[str], structured: bool = False) -> StepCheck:
    """Re-solve step ``t`` n times given steps 0..t-1; its confidence and majority."""
    known = "\n".join(f"- {s.description} -> {s.answer}" for s in steps[:t]) or "nothing yet"
    prompt = RESOLVE.format(question=task.question, known=known,
                            description=steps[t].description)
    # Free text stops at the closing tag; in structured mode the regex ends the sample.
    params = step_params(ctx, RESOLVE_FORM if structured else None, temperature=temperature,
                         stop=[] if structured else ["</answer>"],
                         max_tokens=min(ctx.params.max_tokens, 256))
    gen = await ctx.generate(_user(prompt), params, n=n, step="resolve", strategy=strategy,
                             parents=parents)
    tags = [tag(c.text, "answer") for c in gen]
    record_parse(ctx, gen.event_id, "resolve", [t is not None for t in tags],
                 structured=structured)
    resolves = [a or extract_answer(c.text) for a, c in zip(tags, gen, strict=True)]
    agree, judge_events = await _agreement(ctx, steps[t], resolves, strategy, [gen.event_id],
                                           structured)
    keys = [normalize_answer(r) for r in resolves if r is not None]
    top = max(Counter(keys).values(), default=0)
    # most frequent re-solve; ties go to the one seen first
    majority = next((r for r in resolves if r is not None
                     and Counter(keys)[normalize_answer(r)] == top), None)
    return StepCheck(**steps[t].model_dump(), resolves=resolves,
                     confidence=sum(agree) / max(len(agree), 1), majority=majority,
                     events=[gen.event_id, *judge_events])


async def holistic_judge(task: Task, ctx: Context, attempt: Attempt, strategy: str,
                         parents: list[str], structured: bool = False) -> Judgement:
    """A 0-5 score with an explanation (unreadable -> 2.5, never full marks)."""
    prompt = JUDGE.format(question=task.question, solution=attempt.text)
    params = step_params(ctx, JUDGE_FORM if structured else None, temperature=0.0)
    gen = await ctx.generate(_user(prompt), params, n=1, step="judge",
                             strategy=strategy, parents=parents)
    score = parse_score(gen[0].text, 0, 5).value
    record_parse(ctx, gen.event_id, "judge", [score is not None], structured=structured)
    return Judgement(score=NEUTRAL_JUDGE if score is None else score,
                     readable=score is not None, feedback=gen[0].text.strip()[:1500],
                     event=gen.event_id)


async def assess(task: Task, ctx: Context, attempt: Attempt, params: Any, *, adaptive: bool,
                 strategy: str, structured: bool = False) -> Scored[Assessment]:
    """Score one trajectory; the :class:`Assessment` says how the next refinement goes.

    With ``adaptive`` (ssr_ada) the holistic judge runs first and the
    decomposition only when it gives full marks.
    """
    judge, events = None, []
    if adaptive:
        judge = await holistic_judge(task, ctx, attempt, strategy, attempt.events, structured)
        events.append(judge.event)
        if judge.score < 5:
            return Scored(attempt, judge.score / 5, events=events, detail=Assessment(
                mode="self_refine", reason="judge below full marks", judge=judge))
    steps, dec_events, note = await decompose(task, ctx, attempt, strategy, params.max_steps,
                                              structured)
    events += dec_events
    if not steps:
        return Scored(attempt, judge.score / 5 if judge else None, events=events,
                      detail=Assessment(mode="self_refine", judge=judge, steps=[],
                                        reason=note or "empty decomposition"))
    results = await asyncio.gather(*(
        check_step(task, ctx, steps, t, params.resolves, params.temperature, strategy,
                   dec_events[-1:], structured) for t in range(len(steps))),
        return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    conf = [r.confidence for r in results]
    weakest = conf.index(min(conf))
    full = min(conf) >= 1.0
    eid = ctx.emit("resolve", f"confidence per step {conf}", strategy=strategy,
                   parents=dedupe(e for r in results for e in r.events),
                   confidences=conf, weakest=weakest)
    return Scored(attempt, min(conf), events=[*events, eid], detail=Assessment(
        mode="self_refine" if full else "socratic",
        reason="every step fully confident" if full else note, judge=judge,
        steps=results, weakest=weakest, fully_confident=full))


async def refine(task: Task, ctx: Context, scored: Scored[Assessment], strategy: str,
                 structured: bool = False) -> Attempt:
    """The next trajectory: Socratic refine of the weakest step, or self-refine."""
    d, parents = scored.detail, dedupe([*scored.attempt.events, *scored.events])
    if d.mode == "socratic":
        step = d.steps[d.weakest]
        fix = (f"it should be {step.majority}" if step.majority is not None
               else "I cannot confirm it")
        reflection = REFLECT.format(description=step.description, answer=step.answer, fix=fix)
        msgs = [*task.messages, Message(role="assistant", content=f"{scored.attempt.text}\n\n"
                                        f"{reflection}"), *_user(REEVALUATE)]
        gen = await ctx.generate(msgs, step="refine", strategy=strategy, parents=parents)
        text = gen[0].text
        new = after(text, "</evaluation>")  # the new trajectory follows the evaluation
        return attempt_from(gen[0], strategy=strategy, events=[gen.event_id],
                            text=new or text, mode="socratic", reflection=reflection,
                            **({} if new else {"fallback": "no </evaluation>: kept whole"}))
    judge = d.judge or await holistic_judge(task, ctx, scored.attempt, strategy, parents,
                                            structured)
    msgs = [*task.messages, Message(role="assistant", content=scored.attempt.text),
            *_user(REWRITE.format(feedback=judge.feedback))]
    gen = await ctx.generate(msgs, step="refine", strategy=strategy,
                             parents=dedupe([*parents, judge.event]))
    return attempt_from(gen[0], strategy=strategy, events=[gen.event_id], mode="self_refine",
                        reason=d.reason)


def worst_case(params: Any, child_calls: int, *, adaptive: bool) -> int:
    """Seed + (max_iter + 2) assessments + (max_iter + 1) refinements, each at its worst:
    decompose + retry, and per step one re-solve request plus one judge fallback."""
    assess_calls = 2 + 2 * params.max_steps + (1 if adaptive else 0)
    refine_calls = 1 if adaptive else 2  # self-refine: judge + rewrite (ada reuses its judge)
    return child_calls + (params.max_iter + 2) * assess_calls + (params.max_iter + 1) * refine_calls

