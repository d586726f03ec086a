"""CoT with reflection: think, check the thinking, then answer, in one tagged generation."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.trace import StepKind
from refinery.engine.types import Attempt, Completion, Task
from refinery.strategies.base import attempt_from
from refinery.strategies.cot import CoT

INSTRUCTION = ("Answer in three tagged parts. Inside <thinking></thinking>, work through the "
               "problem step by step. Inside <reflection></reflection>, check that reasoning "
               "for mistakes and say what must be corrected. Inside <output></output>, give "
               "the corrected final answer briefly, as \\boxed{...}.")

SECTIONS = ("thinking", "reflection", "output")
Source = Literal["output", "after_reflection", "whole_text"]


def section(text: str, name: str) -> str | None:
    """The last non-empty ``<name>`` section; an unclosed one ends where another
    section opens, or at the end of the text (a reply cut by ``max_tokens``)."""
    others = "|".join(f"<{s}>" for s in SECTIONS if s != name)
    found = re.findall(rf"<{name}>(.*?)(?:</{name}>|(?={others})|\Z)", text, re.S | re.I)
    bodies = [b.strip() for b in found if b.strip()]
    return bodies[-1] if bodies else None


def output_of(text: str) -> tuple[str, Source]:
    """The user-visible part of a reply and where it came from: the ``<output>``
    section; else what follows the last ``</reflection>``; else the whole reply."""
    out = section(text, "output")
    if out is not None:
        return out, "output"
    tail = re.split(r"</reflection>", text, flags=re.I)
    if len(tail) > 1 and tail[-1].strip():
        return tail[-1].strip(), "after_reflection"
    return text.strip(), "whole_text"


class CoTReflection(CoT):
    """``cot_reflection(temperature=None)``: one reply in thinking, reflection and output parts.

    Steps: the question is followed by an instruction to answer in three
    tagged parts: ``<thinking>`` (step-by-step reasoning), ``<reflection>``
    (a check of that reasoning, naming what to correct) and ``<output>`` (the
    corrected final answer, boxed). One generation; the thinking and the
    reflection are emitted as ``thinking`` / ``reflection`` steps (the server
    streams them as ``reasoning_content``), and only the output is the
    attempt's text, its answer extracted from it. The raw reply stays in the
    trace but is not sent to live listeners, so the reasoning pane does not
    show it twice; nothing streams as content before the reply is split.

    A model that omits ``<output>`` (small ones often do) falls back to the
    text after the last ``</reflection>``, else to the whole reply;
    ``metadata["output_from"]`` says which (``output``, ``after_reflection``,
    ``whole_text``). As a cot variant, ``sc(cot_reflection)`` and
    ``best_of_n(cot_reflection)`` draw their samples in one request.

    Source: OptiLLM's ``cot_reflection`` approach (chain of thought with
    reflection, as in "Reflection"-tuned models' tagged replies).

    Example:
        >>> attempt = await CoTReflection().solve(task, ctx)  # doctest: +SKIP
        >>> # reply: "<thinking>7 * 2 = 14</thinking><reflection>Right.</reflection>
        >>> #         <output>\\boxed{14}</output>"
        >>> attempt.text, attempt.metadata["output_from"]  # doctest: +SKIP
        ('\\\\boxed{14}', 'output')
    """

    name = "cot_reflection"
    tool_turns = False  # its answer is a section of its text

    class Params(CoT.Params):
        instruction: str = Field(INSTRUCTION, description="asks for the three tagged parts")

    async def sample(self, task: Task, ctx: Context, n: int, *,
                     temperature: float | None = None, logprobs: bool = False,
                     final: bool = False, step: StepKind = "draft",
                     parents: Sequence[str] = ()) -> list[Attempt]:
        """``n`` attempts from one request, each reduced to its output part.

        ``final`` is ignored: the raw reply holds the thinking, so it never
        streams as the answer; the server sends the output when the run ends.
        """
        temp = temperature if temperature is not None else self.params.temperature
        params = ctx.params.but(logprobs=logprobs or ctx.params.logprobs,
                                **({} if temp is None else {"temperature": temp}))
        # Traced and budgeted as any call, but hidden from live listeners: its
        # sections reach them as steps below, the output as the answer.
        gen = await ctx.fork(listener=None).generate(
            self.messages(task), params, n=n, step=step, strategy=self.name, parents=parents)
        return [self.split(ctx, comp, gen.event_id) for comp in gen]

    def split(self, ctx: Context, comp: Completion, event_id: str) -> Attempt:
        """One reply as an attempt: its sections emitted as steps, its output as text."""
        events = [event_id]
        for kind in ("thinking", "reflection"):
            body = section(comp.text, kind)
            if body is not None:
                events.append(ctx.emit(kind, body, strategy=self.name, parents=[event_id]))
        text, source = output_of(comp.text)
        return attempt_from(comp, strategy=self.name, events=events, text=text,
                            output_from=source)
