"""The OpenAI Responses API's request, response and stream event schemas (pydantic
models only).

Fields follow OpenAI's. Unknown request fields are accepted and ignored, as on
the chat route; refinery's own extensions sit in one marked block. A response is
stored unless the request says ``store: false`` (or the server has no store);
``previous_response_id`` and ``conversation`` continue stored turns
(serving/conversations.py); ``background`` is refused. The Conversations API's
models are here too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from refinery.serving.protocol import (
    OPTILLM_APPROACH,
    Effort,
    JsonSchemaFormat,
    OpenAIBase,
    RefineryInfo,
    RefineryOptions,
    text_only,
    unicode_text,
)

# -- requests ----------------------------------------------------------------------------


class InputContent(OpenAIBase):
    """A part of an input message or a function call's output: ``input_text`` (or an
    earlier ``output_text``; an earlier reasoning item's ``reasoning_text``); other
    kinds are refused (``text_only``)."""

    type: str
    text: str | None = None

    _text = field_validator("text")(unicode_text)

    @model_validator(mode="after")
    def _only_text(self) -> InputContent:
        return self if self.type == "reasoning_text" else text_only(self)


class InputItem(OpenAIBase):
    """One item of ``input``: a message (``type`` ``message`` or absent), a function
    call the model made earlier, or its output (text, or text parts); ``reasoning``
    items are skipped. Stored items carry an ``id``; other fields are kept as sent."""

    type: str = "message"
    id: str | None = None
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: str | list[InputContent] | None = None
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call
    output: str | list[InputContent] | None = None  # function_call_output

    _text = field_validator("content", "name", "arguments", "output", "call_id")(unicode_text)

    @model_validator(mode="after")
    def _thoughts_in_reasoning_only(self) -> InputItem:
        if self.type != "reasoning" and isinstance(self.content, list) and any(
                p.type == "reasoning_text" for p in self.content):
            raise ValueError("reasoning_text parts belong to reasoning items only")
        return self


class TextFormat(JsonSchemaFormat):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with its schema
    inline (name, schema, strict), not nested as in chat's ``response_format``."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # type: ignore[assignment]  # json_schema only


class TextOptions(OpenAIBase):
    format: TextFormat | None = None


class FunctionTool(OpenAIBase):
    """A function tool, flat as the Responses API has it (chat nests it in ``function``)."""

    type: str
    name: str | None = Field(None, min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _text = field_validator("name", "description", "parameters")(unicode_text)


class FunctionChoice(OpenAIBase):
    type: Literal["function"]
    name: str


class ToolRef(OpenAIBase):
    """A tool an ``allowed_tools`` choice names: ``{"type": "function", "name": ...}``."""

    type: str
    name: str | None = None


class AllowedToolsChoice(OpenAIBase):
    """``tool_choice`` ``{"type": "allowed_tools", "mode": ..., "tools": [...]}``: the
    model may use only these of the request's tools."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[ToolRef] = Field(min_length=1)


class ConversationRef(OpenAIBase):
    id: str = Field(min_length=1)


class ReasoningOptions(OpenAIBase):
    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(OpenAIBase):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: (Literal["none", "auto", "required"] | FunctionChoice | AllowedToolsChoice
                  | None) = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningOptions | None = None
    store: bool | None = Field(None, description="false: not stored (default: stored).")
    previous_response_id: str | None = Field(
        None, description="A stored response this one continues: its input and output "
        "come before this input (not its instructions).")
    conversation: str | ConversationRef | None = Field(
        None, description="A conversation (conv_...) whose items come before this input; "
        "this input and the output are appended to it.")
    background: bool | None = Field(None, description="Refused when true.")
    metadata: dict[str, str] | None = None
    user: str | None = None
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryOptions | None = Field(
        None, description="Strategy, budget and trace options (send via extra_body).")
    optillm_approach: str | None = Field(None, description=OPTILLM_APPROACH)

    _text = field_validator("model", "input", "instructions", "optillm_approach",
                            "previous_response_id")(unicode_text)


# -- responses ---------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)


class SummaryText(BaseModel):
    type: Literal["summary_text"] = "summary_text"
    text: str = ""


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class ReasoningItem(BaseModel):
    """The model's own thinking (``content``: one ``reasoning_text``, as vLLM's
    Responses API sends it; absent without a reasoning parser) and a strategy's steps
    (``summary``: each step one summary text)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    status: Literal["in_progress", "completed"] = "completed"


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = MessageItem | ReasoningItem | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(
        0, description="Generated tokens that are not the answer's (0 on passthrough).")


class ResponseUsage(BaseModel):
    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseObject(BaseModel):
    """The response, whole, and as ``response.*`` events carry it."""

    model_config = ConfigDict(ser_json_inf_nan="null")

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"] = "completed"
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    conversation: ConversationRef | None = None
    reasoning: ReasoningOptions = Field(default_factory=ReasoningOptions)
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    # -- refinery extensions -----------------------------------------------------------
    refinery: RefineryInfo | None = None


# -- conversations ----------------------------------------------------------------------


class ConversationRequest(OpenAIBase):
    """``POST /v1/conversations``: up to 20 first items, metadata."""

    items: list[InputItem] | None = Field(None, max_length=20)
    metadata: dict[str, str] | None = None


class ConversationUpdate(OpenAIBase):
    """``POST /v1/conversations/{id}``: the conversation's new metadata."""

    metadata: dict[str, str]


class ItemsRequest(OpenAIBase):
    """``POST /v1/conversations/{id}/items``: up to 20 items to append."""

    items: list[InputItem] = Field(min_length=1, max_length=20)


class ConversationObject(BaseModel):
    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = Field(default_factory=dict)


class Deleted(BaseModel):
    """What a DELETE answers: ``object`` is ``response`` or ``conversation.deleted``."""

    id: str
    object: str
    deleted: bool = True


class ItemList(BaseModel):
    """A page of items (a conversation's, or the input a response read)."""

    object: Literal["list"] = "list"
    data: list[InputItem]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


# -- stream events -----------------------------------------------------------------------


class ResponseEvent(BaseModel):
    """One event of a streamed response; ``type`` names it (also the SSE ``event:``).

    The fields each type carries are OpenAI's: ``response`` on ``response.*``
    lifecycle events, ``item`` on output item events, ``part`` on content and
    summary part events, ``delta`` / ``text`` / ``arguments`` on the rest.
    """

    type: str
    sequence_number: int
    response: ResponseObject | None = None
    output_index: int | None = None
    item: OutputItem | None = None
    item_id: str | None = None
    content_index: int | None = None
    summary_index: int | None = None
    part: OutputText | SummaryText | ReasoningText | None = None
    delta: str | None = None
    text: str | None = None
    arguments: str | None = None
    name: str | None = None
    logprobs: list[Any] | None = None
    # the ``error`` event
    code: str | None = None
    message: str | None = None
    param: str | None = None
