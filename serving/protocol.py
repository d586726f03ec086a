"""OpenAI-compatible request and response schemas (pydantic models only).

Fields follow the OpenAI API's order. Unknown request fields are accepted and
ignored, as vLLM does. refinery's own extensions sit in one marked block per
model, each with a description; so do the fields of vLLM's server we accept
(``structured_outputs`` and the older ``guided_*``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from refinery.engine.types import TokenLogprob


def strings(value: Any) -> Iterator[str]:
    """Every string in ``value``: itself, or nested in lists and objects (keys too).

    Iterative: a schema nested a thousand levels deep is no RecursionError here.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())


def unicode_text(value: Any) -> Any:
    """Refuse strings (alone, in a list, or in a JSON object) that are not encodable text.

    JSON allows ``"\\ud800"``, which decodes to a lone surrogate: text no
    tokenizer (nor any UTF-8 encoder) can take. Refused here, it is a 400
    naming the field instead of a failure deep in the engine (a schema is
    written into prompts and handed to the engine's grammar compiler).
    """
    for text in strings(value):
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"not valid Unicode text: a lone surrogate "
                                 f"({text[exc.start]!r}) at position {exc.start}") from None
    return value


# Content part types with text in them (chat's, then the Responses API's).
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})


def text_only(part: Any) -> Any:
    """Refuse a content part that is not text: the served model reads text only, and a
    part dropped unread would answer a question the client did not ask."""
    if part.type in IMAGE_PARTS:
        raise PydanticCustomError("text_only", "a part of type {kind}: this model takes "
                                  "text only", {"kind": part.type})
    if part.type not in TEXT_PARTS:
        raise PydanticCustomError("text_only", "a part of type {kind}, which is not "
                                  "supported: send text parts ({known})", {
                                      "kind": part.type, "known": ", ".join(sorted(TEXT_PARTS))})
    return part


OPTILLM_APPROACH = ("OptiLLM's approach (e.g. 'moa', 'bon'), as OptiLLM clients send it via "
                    "extra_body: run as the refinery strategy it maps to. 'none' is "
                    "passthrough, 'auto' leaves the choice to the model field; "
                    "refinery.strategy overrides it.")


# OpenAI's reasoning effort levels; the server maps each to a strategy (ServerConfig.effort).
Effort = Literal["none", "minimal", "low", "medium", "high"]
REASONING_EFFORT = ("How hard to think: the server runs the strategy it maps this level to "
                    "(GET /v1/models lists them). A strategy named in the model field or "
                    "refinery.strategy wins.")


REASONING = ("The model's own thinking (its reasoning parser's), then a strategy's steps; "
             "never part of the answer (vLLM's field).")
REASONING_CONTENT = "The same text as reasoning, for clients that read the older field."
THINKING_BUDGET = ("vLLM's cap on a reasoning model's thinking tokens, passed to every "
                   "generation (the engine must run a reasoning parser).")


class OpenAIBase(BaseModel):
    # Clients send fields we do not implement (logit_bias, tools, ...): accept them.
    model_config = ConfigDict(extra="allow")


# -- requests ----------------------------------------------------------------------------

class ContentPart(OpenAIBase):
    """A part of a message's content: text (other kinds are refused: ``text_only``)."""

    type: str
    text: str | None = None

    _text = field_validator("text")(unicode_text)
    _only_text = model_validator(mode="after")(text_only)


class FunctionCall(OpenAIBase):
    name: str
    arguments: str  # a JSON object, as a string

    _text = field_validator("name", "arguments")(unicode_text)


class ToolCall(OpenAIBase):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIBase):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    function_call: FunctionCall | None = None  # legacy: an assistant's earlier call

    _text = field_validator("content", "name", "tool_call_id")(unicode_text)


class FunctionDefinition(OpenAIBase):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None

    _text = field_validator("name", "description", "parameters")(unicode_text)


class ChatTool(OpenAIBase):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(OpenAIBase):
    name: str


class NamedToolChoice(OpenAIBase):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: FunctionName


class AllowedTools(OpenAIBase):
    """The tools a request lets the model use, out of those it lists: ``auto`` may
    call one of them, ``required`` must."""

    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)


class AllowedToolsChoice(OpenAIBase):
    """``tool_choice`` ``{"type": "allowed_tools", "allowed_tools": {...}}``."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class JsonSchemaFormat(OpenAIBase):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="Accepted; the schema is always enforced.")

    _text = field_validator("name", "json_schema")(unicode_text)


class ResponseFormat(OpenAIBase):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(OpenAIBase):
    """vLLM's ``structured_outputs`` request field: one of json, regex, choice, grammar."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = Field(
        None, description="An xgrammar structural tag (as an object or JSON text), "
        "enforced by the engine.")
    disable_any_whitespace: bool | None = Field(
        None, description="Accepted and ignored: whether JSON is compact is the engine's "
        "setting (VLLMBackend: compact by default).")

    _text = field_validator("json_", "regex", "choice", "grammar")(unicode_text)


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


class VLLMStructuredFields(OpenAIBase):
    """vLLM's server fields for constrained decoding (at most one may be set)."""

    structured_outputs: StructuredOutputs | None = Field(
        None, description="vLLM: one of json, regex, choice, grammar.")
    guided_json: dict[str, Any] | str | None = Field(None, description="vLLM (older).")
    guided_regex: str | None = Field(None, description="vLLM (older).")
    guided_choice: list[str] | None = Field(None, description="vLLM (older).")
    guided_grammar: str | None = Field(None, description="vLLM (older).")

    _guided = field_validator("guided_json", "guided_regex", "guided_choice",
                              "guided_grammar")(unicode_text)


class ChatCompletionRequest(VLLMStructuredFields):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=16)
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = None
    reasoning_effort: Effort | None = Field(None, description=REASONING_EFFORT)
    thinking_token_budget: int | None = Field(None, ge=0, description=THINKING_BUDGET)
    response_format: ResponseFormat | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    tool_choice: ToolChoice | None = None
    tools: list[ChatTool] | None = Field(None, min_length=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    user: str | None = None
    functions: list[FunctionDefinition] | None = Field(
        None, min_length=1, description="Legacy tools: answered as message.function_call.")
    function_call: Literal["none", "auto"] | FunctionName | None = Field(
        None, description="Legacy tool_choice, with functions.")
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryOptions | None = Field(
        None, description="Strategy, budget and trace options (send via extra_body).")
    optillm_approach: str | None = Field(None, description=OPTILLM_APPROACH)

    _text = field_validator("model", "stop", "optillm_approach")(unicode_text)


class CompletionRequest(VLLMStructuredFields):
    model: str
    prompt: str | list[str]
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=20, description="Top alternatives per "
                                 "token; 0 = the sampled token's logprob only.")
    max_tokens: int | None = Field(16, ge=1)
    n: int = Field(1, ge=1, le=16)
    reasoning_effort: Effort | None = Field(None, description=REASONING_EFFORT)
    thinking_token_budget: int | None = Field(None, ge=0, description=THINKING_BUDGET)
    response_format: ResponseFormat | None = Field(None, description="As vLLM accepts it.")
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
    optillm_approach: str | None = Field(None, description=OPTILLM_APPROACH)

    _text = field_validator("model", "prompt", "stop", "optillm_approach")(unicode_text)


# -- responses ---------------------------------------------------------------------------

class PromptTokensDetails(BaseModel):
    cached_tokens: int | None = Field(
        None, description="Prompt tokens served from the engine's prefix cache "
        "(summed over the calls; a prompt shared by parallel samples counts once).")


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = Field(
        0, description="Generated tokens that are not the returned answers': the "
        "model's own thinking (0 on passthrough without a reasoning parser), and under "
        "a strategy every token but those of the sample(s) that became the answer(s).")


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = Field(
        None, description="Sent when the backend reports cached prompt tokens.")
    completion_tokens_details: CompletionTokensDetails = Field(
        default_factory=CompletionTokensDetails)


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
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = Field(
        None, description="The legacy form of the call, when the request sent functions.")
    reasoning: str | None = Field(None, description=REASONING)
    reasoning_content: str | None = Field(None, description=REASONING_CONTENT)

    @model_serializer(mode="wrap")
    def _always_content(self, handler: SerializerFunctionWrapHandler):
        # content and refusal are always sent, null when absent (a tool call's
        # content is null), as OpenAI does; responses are dumped with exclude_none.
        # No return annotation: with one, the documented schema would lose the fields.
        data = handler(self)
        data.setdefault("content", None)
        data.setdefault("refusal", None)
        return data


class ChoiceLogprobs(BaseModel):
    """A chat choice's logprobs: one entry per token of the content."""

    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
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


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of a streamed tool call: the first has id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None
    function_call: DeltaFunctionCall | None = None  # legacy functions
    reasoning: str | None = Field(None, description=REASONING)
    reasoning_content: str | None = Field(None, description=REASONING_CONTENT)


class ChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
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


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token.

    ``top_logprobs`` maps the sampled token and the most likely alternatives to
    their logprobs; ``text_offset`` is each token's character offset in the text.
    """

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = "stop"
    reasoning: str | None = Field(None, description=REASONING)
    reasoning_content: str | None = Field(None, description=REASONING_CONTENT)


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
    reasoning_effort: dict[str, str | None] | None = Field(
        None, description="For the served model: the spec each reasoning_effort level runs "
        "(null: passthrough).")


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
