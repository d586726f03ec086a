"""The split of a generated text into parts: the model's thinking, its answer, its calls.

A reasoning model thinks before it answers (``<think>...</think>`` then the answer);
a model with a native tool-call format writes its calls inside its output (Hermes and
Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``). ``PartsParser``
splits a completion with vLLM's own parsers, chosen by the names vLLM's server takes
(``--reasoning-parser``, ``--tool-call-parser``), composed as vLLM composes them:
reasoning first, then tool calls in the answer. The split is the same whole
(``split``) and streamed (``stream``): the streamed parts concatenate to the whole's.

Calls are parsed only when the request offers tools (as vLLM's server does with
``tool_choice: auto``); without tools a tool-call parser leaves the answer alone.

Example:
    >>> from transformers import AutoTokenizer  # doctest: +SKIP
    >>> tok = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B")  # doctest: +SKIP
    >>> parts = PartsParser(tok, reasoning_parser="qwen3", tool_call_parser="hermes")
    ... # doctest: +SKIP
    >>> parts.split("<think>2+2 is 4</think>4").text  # doctest: +SKIP
    '4'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from refinery.engine.errors import InvalidRequestError
from refinery.engine.tool_calls import Call, CallDelta, Tool


@dataclass(frozen=True)
class Parts:
    """A whole completion split: ``reasoning`` (None: no reasoning parser, or it found
    none), ``text`` (the answer outside any call), ``tool_calls`` (None: none parsed),
    ``reasoning_tokens`` (the thinking's tokens; None without a reasoning parser)."""

    reasoning: str | None
    text: str
    tool_calls: list[Call] | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True)
class PartsDelta:
    """One streamed piece split: its thinking text, its answer text, its call pieces."""

    reasoning: str = ""
    text: str = ""
    tool_calls: list[CallDelta] | None = None


def parser_names() -> tuple[list[str], list[str]]:
    """The reasoning-parser and tool-call-parser names vLLM knows."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    return ReasoningParserManager.list_registered(), ToolParserManager.list_registered()


def check_parser_names(reasoning_parser: str | None, tool_call_parser: str | None) -> None:
    """Raise InvalidRequestError, listing the known names, for a name vLLM lacks."""
    reasoning_names, tool_names = parser_names()
    for name, known, param in ((reasoning_parser, reasoning_names, "reasoning_parser"),
                               (tool_call_parser, tool_names, "tool_call_parser")):
        if name is not None and name not in known:
            raise InvalidRequestError(f"unknown {param} {name!r}; vLLM knows: "
                                      + ", ".join(known), param=param, code="unknown_parser")


class PartsParser:
    """Splits completions with the parsers vLLM's server would use for these names.

    ``tokenizer`` is the model's (a Hugging Face tokenizer); a think parser needs its
    start/end tokens in the vocabulary, and a model whose tokenizer lacks them is a
    clear ``InvalidRequestError`` here, not a silent non-split later.

    Example:
        >>> parts = PartsParser(tok, reasoning_parser="deepseek_r1")  # doctest: +SKIP
        >>> p = parts.split("<think>hmm \\\\boxed{3}</think>It is 4.")  # doctest: +SKIP
        >>> p.reasoning, p.text  # doctest: +SKIP
        ('hmm \\\\boxed{3}', 'It is 4.')
    """

    def __init__(self, tokenizer: Any, *, reasoning_parser: str | None = None,
                 tool_call_parser: str | None = None):
        self.reasoning_parser = reasoning_parser
        self.tool_call_parser = tool_call_parser
        self.tokenizer = tokenizer
        self._cls: Any = None
        if reasoning_parser is None and tool_call_parser is None:
            return  # nothing to split: no vLLM import, any tokenizer
        check_parser_names(reasoning_parser, tool_call_parser)
        from vllm.parser.parser_manager import ParserManager
        from vllm.tokenizers.hf import get_cached_tokenizer

        # vLLM's cached view: a parser per completion then costs microseconds, not the
        # tens of milliseconds a fresh vocabulary would.
        self.tokenizer = get_cached_tokenizer(tokenizer)
        try:
            self._cls = ParserManager.get_parser(
                tool_parser_name=tool_call_parser, reasoning_parser_name=reasoning_parser,
                enable_auto_tools=tool_call_parser is not None, tokenizer=self.tokenizer)
        except (TypeError, ValueError, KeyError) as exc:
            raise InvalidRequestError(f"the parsers do not fit this model: {exc}",
                                      code="unknown_parser") from exc

    @property
    def active(self) -> bool:
        """Whether any parser is configured (without one, text passes through)."""
        return self._cls is not None

    def request(self, tools: Sequence[Tool] | None = None) -> Any:
        """The vLLM chat request the parsers read (the tools; auto choice), adjusted as
        vLLM's server adjusts it (e.g. special tokens kept for the Hermes tags)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        req = ChatCompletionRequest(model="refinery", messages=[],
                                    tools=[openai_tool(t) for t in tools] if tools else None)
        return self._new().adjust_request(req) if self._cls is not None else req

    def keeps_special_tokens(self, tools: Sequence[Tool] | None = None) -> bool:
        """Whether the detokenized text must keep special tokens for the parsers."""
        return self.active and not self.request(tools).skip_special_tokens

    def _new(self) -> Any:
        assert self._cls is not None
        return self._cls(self.tokenizer, None)

    def split(self, text: str, token_ids: Sequence[int] = (),
              tools: Sequence[Tool] | None = None) -> Parts:
        """The parts of a whole completion (``token_ids``: its generated tokens)."""
        if self._cls is None:
            return Parts(None, text)
        parser = self._new()
        reasoning, content, calls = parser.parse(text, self.request(tools),
                                                 enable_auto_tools=True,
                                                 model_output_token_ids=list(token_ids))
        return Parts(reasoning, content or "", [_call(c) for c in calls] if calls else None,
                     self._reasoning_tokens(parser, token_ids))

    def stream(self, tools: Sequence[Tool] | None = None,
               prompt_token_ids: Sequence[int] | None = None) -> PartsStream:
        """A splitter for one streamed completion: ``feed`` each piece, then ``end``."""
        return PartsStream(self, tools, prompt_token_ids)

    def _reasoning_tokens(self, parser: Any, token_ids: Sequence[int]) -> int | None:
        if self.reasoning_parser is None:
            return None
        return parser.count_reasoning_tokens(list(token_ids))


@dataclass
class PartsStream:
    """The streamed split of one completion, piece by piece (vLLM's ``parse_delta``).

    ``feed`` takes each piece's text and token ids and returns its parts; ``end``
    flushes what the parsers held back. ``reasoning_tokens`` and ``tool_calls`` are
    then the whole completion's, the same as ``PartsParser.split`` gives.
    """

    parts: PartsParser
    tools: Sequence[Tool] | None = None
    prompt_token_ids: Sequence[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    calls: CallPieces = field(default_factory=lambda: CallPieces())

    def __post_init__(self) -> None:
        self._parser = self.parts._new() if self.parts.active else None
        self._request = self.parts.request(self.tools)
        self._prompt = list(self.prompt_token_ids) if self.prompt_token_ids else None

    def feed(self, delta_text: str, delta_token_ids: Sequence[int] = ()) -> PartsDelta:
        """The parts of one piece."""
        return self._delta(delta_text, list(delta_token_ids), finished=False)

    def end(self) -> PartsDelta:
        """What the parsers still held when the completion ended."""
        return self._delta("", [], finished=True)

    def _delta(self, text: str, ids: list[int], *, finished: bool) -> PartsDelta:
        self.token_ids += ids
        if self._parser is None:
            return PartsDelta(text=text)
        msg = self._parser.parse_delta(text, ids, self._request, self._prompt,
                                       finished=finished)
        self._prompt = None  # the prompt is read once, on the first piece
        if msg is None:
            return PartsDelta()
        deltas = [self._call_delta(tc) for tc in msg.tool_calls or []]
        return PartsDelta(reasoning=msg.reasoning or "", text=msg.content or "",
                          tool_calls=deltas or None)

    def _call_delta(self, tc: Any) -> CallDelta:
        fn = tc.function
        name, args = (fn.name, fn.arguments) if fn is not None else (None, None)
        return self.calls.add(tc.index, name, args)

    @property
    def tool_calls(self) -> list[Call] | None:
        """The calls the pieces made, whole (None: none)."""
        return self.calls.calls

    @property
    def reasoning_tokens(self) -> int | None:
        if self._parser is None or self.parts.reasoning_parser is None:
            return None
        return self._parser.count_reasoning_tokens(self.token_ids)


@dataclass
class CallPieces:
    """Streamed call pieces gathered into whole calls (by ``index``), as every
    backend that streams native calls (vLLM's parsers, an upstream's deltas) needs.

    Example:
        >>> pieces = CallPieces()
        >>> pieces.add(0, "add", '{"a": ').name, pieces.add(0, None, "1}").name
        ('add', None)
        >>> pieces.calls
        [Call(name='add', arguments={'a': 1})]
    """

    known: dict[int, list[str]] = field(default_factory=dict)  # index: [name, arguments]

    def add(self, index: int, name: str | None, arguments: str | None) -> CallDelta:
        """Record one piece; the piece as a ``CallDelta``."""
        known = self.known.setdefault(index, ["", ""])
        known[0] = known[0] or name or ""
        known[1] += arguments or ""
        return CallDelta(index=index, name=name, arguments=arguments or "")

    @property
    def calls(self) -> list[Call] | None:
        """The whole calls so far, in index order (None: none)."""
        if not self.known:
            return None
        return [call_of(name, args) for _, (name, args) in sorted(self.known.items())]


def openai_tool(tool: Tool) -> dict[str, Any]:
    """A tool in the OpenAI request shape (what chat templates and vLLM's parsers read)."""
    fn: dict[str, Any] = {"name": tool.name, "parameters": tool.parameters}
    if tool.description:
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


def _call(fc: Any) -> Call:
    return call_of(fc.name, fc.arguments)


def call_of(name: str, arguments: str | None) -> Call:
    """A Call from a name and its arguments' JSON text; arguments that are not a JSON
    object (a cut-off call) are kept under ``"_raw"`` rather than lost.

    Example:
        >>> call_of("add", '{"a": 1}'), call_of("add", '{"a": ')
        (Call(name='add', arguments={'a': 1}), Call(name='add', arguments={'_raw': '{"a": '}))
    """
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return Call(name, {"_raw": arguments})
    return Call(name, args if isinstance(args, dict) else {"_raw": arguments})
