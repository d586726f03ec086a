"""OpenAI-compatible request and response schemas (pydantic models only).

Fields follow the OpenAI API's order. Unknown request fields are accepted and
ignored, as vLLM does. refinery's own extensions sit in one marked block per
model, each with a description.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def unicode_text(value: Any) -> Any:
    """Refuse strings (alone or in a list) that are not encodable text.

    JSON allows ``"\\ud800"``, which decodes to a lone surrogate: text no
    tokenizer (nor any UTF-8 encoder) can take. Refused here, it is a 400
    naming the field instead of a failure deep in the engine.
    """
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str) and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"not valid Unicode text: a lone surrogate "
                                 f"({text[exc.start]!r}) at position {exc.start}") from None
    return value


class OpenAIBase(BaseModel):
    # Clients send fields we do not implement (logit_bias, tools, ...): accept them.
    model_config = ConfigDict(extra="allow")


# -- requests ----------------------------------------------------------------------------

class ContentPart(OpenAIBase):
    type: str
    text: str | None = None

    _text = field_validator("text")(unicode_text)


class ChatMessage(OpenAIBase):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    _text = field_validator("content", "name")(unicode_text)


class StreamOptions(OpenAIBase):
    include_usage: bool = False


class RefineryBudget(OpenAIBase):
    max_tokens: int | None = Field(None, ge=1, description="Total tokens over all calls.")
    max_calls: int | None = Field(None, ge=1, description="Model calls over the request.")
    max_seconds: float | None = Field(None, gt=0, description="Wall-clock seconds.")


class RefineryOptions(OpenAIBase):
    """The ``refinery`` object a client sends through ``extra_body``."""

    strategy: str | None = Field(None, description="Strategy spec, e.g. 'sc(cot, n=4)'. "
                                 "Overrides a spec given in the model field.")
    budget: RefineryBudget | None = Field(None, description="Per-request budget; capped by "
                                          "the server's limits.")
    trace: Literal["none", "summary", "full"] = Field(
        "none", description="Return a trace summary or the full trace in the response.")
    loop_policy: Literal["off", "truncate", "retry"] | None = Field(
        None, description="What to do when the loop detector fires (default: server's).")

    _text = field_validator("strategy")(unicode_text)


class ChatCompletionRequest(OpenAIBase):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=16)
    presence_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = None
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryOptions | None = Field(
        None, description="Strategy, budget and trace options (send via extra_body).")

    _text = field_validator("model", "stop")(unicode_text)


class CompletionRequest(OpenAIBase):
    model: str
    prompt: str | list[str]
    echo: bool | None = None
    max_tokens: int | None = Field(16, ge=1)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = None
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryOptions | None = Field(
        None, description="Strategy, budget and trace options (send via extra_body).")

    _text = field_validator("model", "prompt", "stop")(unicode_text)


# -- responses ---------------------------------------------------------------------------

class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class RefineryInfo(BaseModel):
    """refinery extension on responses: what the strategy spent and did."""

    strategy: str | None = Field(None, description="Canonical strategy spec, None = passthrough.")
    calls: int = Field(0, description="Model calls behind this response, all choices.")
    seconds: float = Field(0.0, description="Wall time of the request.")
    trace: list[dict[str, Any]] | None = Field(
        None, description="Per choice: a trace summary or the full trace, when asked.")


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: None = None
    finish_reason: str | None = "stop"


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryInfo | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryInfo | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = "stop"


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryInfo | None = None


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "refinery"
    # -- refinery extensions -----------------------------------------------------------
    strategy: str | None = Field(None, description="For a preset: the spec it runs.")
    worst_case_calls: int | None = Field(None, description="For a preset: worst-case calls.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    # All four keys are always sent (null when unknown): required in the schema.
    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorResponse(BaseModel):
    error: ErrorInfo
