"""A deterministic test double of the Backend protocol, for unit tests of
strategies' control flow only (system tests use the real model).

Rules map a regex (searched in the whole prompt, all turns joined) to a reply:
a string, a list of strings (sample i of a call gets item i, cycling), or a
callable ``(messages, params, i) -> str``. First matching rule wins.

    backend = ScriptedBackend([
        (r"sub-questions", '{"sub-questions": []}'),
        (r".*", ["The answer is 4.", "The answer is 5."]),
    ])

Optional knobs (all off by default, so the double answers at once): ``yields``
zero-delay loop yields inside every call (concurrent calls interleave as in
vLLM, deterministically), ``delay`` seconds per call (a slow engine), and
``hang_after`` (calls after the first ``hang_after`` never finish: they wait
until cancelled). ``log`` records ("start" | "done" | "cancel", call index) in
order, so a test can prove which calls a deadline cancelled and that none
started after it.

Constraints: ``structured_outputs`` lists the kinds the double accepts (all by
default); a call with another kind raises ``UnsupportedConstraintError`` as a real
backend does. The double does not enforce constraints: rules see ``params`` and
reply accordingly. ``logprobs=True`` gets one TokenLogprob per word (streamed
with its word), each with ``top_logprobs`` alternatives: the word itself, then
``alt1``, ``alt2``...

Stop rules: off by default (a ``stop_rule`` is ignored, as the double always did).
``watch=True`` runs them as the real backends do, through the same fan-out
(``engine.backends.fan_out``) and stream driver (``engine.stops.WatchedStream``),
one word a token: a streamed sample stopped by its rule ends at the word that
tipped it, with that many completion tokens. ``whole_check_max_tokens`` is the
real backends' knob (None here by default: every watched sample is streamed);
a call it lets through is one request, each sample checked whole after it ends,
so a stopped one keeps all its words' tokens counted. ``tops`` gives
chosen per-token logprobs: ``tops(text, i)`` returns, for each word of sample
``i``'s reply, its candidates' log-probabilities, most likely first (the first
is the word's own); words past the list keep the default ones.

Continuation: ``continue_final=True`` is checked as the real backends check it
(the last message must be the assistant's; ``continues_messages=False`` makes
the double an upstream that cannot) and recorded in ``Call.continue_final``;
the reply is the continuation alone.

Prefix cache: ``cached_tokens`` (None by default: not reported) is what every
completion reports as its prompt's cached tokens, as vLLM's
``num_cached_tokens``.

Parts: ``reasoning_parser`` (any name, None by default) splits a reply's
``<think>...</think>`` off into ``Completion.reasoning`` (one token a word, in
``reasoning_tokens``); ``tool_call_parser`` (any name) reads a reply's
``<tool_call>`` envelopes into ``Completion.tool_calls`` when the call offers
``params.tools``, the text before them staying ``text`` (right-stripped), as vLLM's
Hermes parser does. Streamed: the thinking word by word in ``Delta.reasoning``, then the answer,
then each call as one ``CallDelta``; stop rules watch the answer.

Health: ``dead=True`` (or ``die()``) makes it a dead engine for the server's
/health and on-engine-death policy; ``in_flight`` counts the slow calls that
started and have not finished.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from refinery.engine.backends.base import check_continuable, require_continuation
from refinery.engine.backends.fan_out import fan_out
from refinery.engine.constraints import ALL_KINDS, require_support
from refinery.engine.stops import Piece, StopRule, WatchedStream, caller_tokens, wire_params
from refinery.engine.tool_calls import OPEN, CallDelta, parse_calls
from refinery.engine.types import (
    Completion,
    Delta,
    Message,
    SamplingParams,
    TokenLogprob,
    TopLogprob,
)

Reply = str | list[str] | Callable[[Sequence[Message], SamplingParams, int], str]
Tops = Callable[[str, int], Sequence[Sequence[float]]]


@dataclass
class Call:
    messages: list[Message]
    params: SamplingParams
    n: int
    continue_final: bool = False


@dataclass
class ScriptedBackend:
    rules: list[tuple[str, Reply]]
    model: str = "scripted"
    max_model_len: int = 4096
    calls: list[Call] = field(default_factory=list)
    yields: int = 0
    delay: float = 0.0
    hang_after: int | None = None
    log: list[tuple[str, int]] = field(default_factory=list)
    dead: bool = False
    closed: bool = False
    structured_outputs: frozenset[str] = ALL_KINDS
    continues_messages: bool = True
    cached_tokens: int | None = None
    watch: bool = False
    tops: Tops | None = None
    paced: bool = False  # streams yield to the loop between words (samples interleave)
    whole_check_max_tokens: int | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None

    # -- health (what the server reads) --------------------------------------------------

    @property
    def healthy(self) -> bool:
        return not self.dead

    @property
    def status(self) -> str:
        return "engine died" if self.dead else "ok"

    async def check_health(self) -> bool:
        return self.healthy

    def die(self) -> None:
        """From now on the engine is dead for good, as a vLLM core that crashed."""
        self.dead = True

    @property
    def in_flight(self) -> int:
        """Slow calls started and not yet done or cancelled."""
        return sum(1 if what == "start" else -1 for what, _ in self.log)

    @property
    def cancelled(self) -> list[int]:
        """Indices of the calls that were cancelled (or closed) before they finished."""
        return [i for what, i in self.log if what == "cancel"]

    async def _wait(self, index: int) -> None:
        """The knobs' waiting; records a cancellation that lands here."""
        self.log.append(("start", index))
        try:
            for _ in range(self.yields):
                await asyncio.sleep(0)
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.hang_after is not None and index >= self.hang_after:
                await asyncio.Event().wait()  # only cancellation ends this call
        except (asyncio.CancelledError, GeneratorExit):
            self.log.append(("cancel", index))
            raise

    @property
    def _slow(self) -> bool:
        return bool(self.yields or self.delay or self.hang_after is not None)

    def _reply(self, messages: Sequence[Message], params: SamplingParams, i: int) -> str:
        prompt = "\n".join(m.content for m in messages)
        for pattern, reply in self.rules:
            if re.search(pattern, prompt, re.S):
                if callable(reply):
                    return reply(messages, params, i)
                if isinstance(reply, list):
                    return reply[i % len(reply)]
                return reply
        raise AssertionError(f"no scripted reply for prompt: {prompt[-300:]!r}")

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return sum(len(m.content.split()) + 4 for m in messages)

    def _completion(self, messages, params, i) -> Completion:
        require_support(params.constraint, self.structured_outputs, "scripted")
        text = self._reply(messages, params, i)
        words = text.split()
        finish = "stop"
        if len(words) > params.max_tokens:
            text, finish = " ".join(words[: params.max_tokens]), "length"
        comp = Completion(text=text, prompt_tokens=self.count_tokens(messages),
                          cached_tokens=self.cached_tokens,
                          completion_tokens=min(len(words), params.max_tokens) or 1,
                          finish_reason=finish, logprob=-float(i) if params.logprobs else None,
                          token_logprobs=(_word_logprobs(text, i, params.top_logprobs,
                                                         self.tops)
                                          if params.logprobs else None))
        return self._split(comp, params)

    def _split(self, comp: Completion, params: SamplingParams) -> Completion:
        """The reply split into parts as a backend with these parsers splits it."""
        reasoning, answer = None, comp.text
        if self.reasoning_parser is not None and ("</think>" in answer
                                                  or answer.startswith("<think>")):
            # cut off while thinking: all of it is thinking, the answer empty
            thought, _, answer = answer.partition("</think>")
            reasoning = thought.removeprefix("<think>")
        calls = None
        if self.tool_call_parser is not None and params.tools and OPEN in answer:
            at = answer.index(OPEN)
            calls = parse_calls(answer[at:]).calls or None
            answer = answer[:at].rstrip() if calls else answer  # streamed a word a piece
        return comp.model_copy(update={
            "text": answer, "reasoning": reasoning, "tool_calls": calls,
            "reasoning_tokens": (len(reasoning.split()) if reasoning is not None else
                                 0 if self.reasoning_parser is not None else None)})

    def _rule(self, stop_rule: StopRule | None) -> StopRule | None:
        return stop_rule if self.watch else None

    def _record(self, messages, params, n, continue_final) -> None:
        if continue_final:
            require_continuation(self, "scripted")
            check_continuable(messages)
        self.calls.append(Call(list(messages), params, n, continue_final))

    async def generate(self, messages, params, *, n=None, stop_rule=None,
                       continue_final=False) -> list[Completion]:
        n = params.n if n is None else n
        self._record(messages, params, n, continue_final)
        if self._slow:
            index = len(self.calls) - 1
            await self._wait(index)
            self.log.append(("done", index))
        rule, wire = self._rule(stop_rule), wire_params(params, self._rule(stop_rule))
        return await fan_out(
            n, rule, params, self.whole_check_max_tokens,
            one_request=lambda k: self._one_request(messages, params, k),
            one_stream=lambda i: self._deltas(self._completion(messages, wire, i), params, rule))

    async def _one_request(self, messages, params, n: int) -> list[Completion]:
        return [self._completion(messages, params, i) for i in range(n)]

    async def stream(self, messages, params, *, stop_rule=None,
                     continue_final=False) -> AsyncIterator[Delta]:
        self._record(messages, params, 1, continue_final)
        index = len(self.calls) - 1
        if self._slow:
            await self._wait(index)
        rule = self._rule(stop_rule)
        comp = self._completion(messages, wire_params(params, rule), 0)
        try:
            async for delta in self._deltas(comp, params, rule):
                yield delta
        except GeneratorExit:  # the consumer closed the stream early (an abort)
            if self._slow:
                self.log.append(("cancel", index))
            raise
        if self._slow:
            self.log.append(("done", index))

    async def _deltas(self, comp: Completion, params: SamplingParams,
                      rule: StopRule | None) -> AsyncIterator[Delta]:
        """``comp`` word by word through a monitor of ``rule``, as a real backend streams."""
        tokens = comp.token_logprobs or []
        for word in re.findall(r"\s*\S+", comp.reasoning or ""):
            yield Delta(reasoning=word)
        stream = WatchedStream(rule, params)
        async for delta in stream.deltas(_pieces(comp.text, tokens, self.paced)):
            yield delta
        for index, call in enumerate(comp.tool_calls or []):
            yield Delta(tool_calls=[CallDelta(index, call.name, call.arguments_json)])
        watch, used = stream.watch, stream.n_tokens
        if rule is not None:
            stop = watch.stop
            comp = comp.model_copy(update={
                "text": watch.text, "loop_onset": watch.onset, "measures": watch.measures(),
                "finish_reason": stop.reason if stop else comp.finish_reason,
                "completion_tokens": used if stop else comp.completion_tokens,
                "token_logprobs": caller_tokens(tokens[:used], params)})
        yield Delta(finish_reason=comp.finish_reason, completion=comp)

    async def aclose(self) -> None:
        self.closed = True


def _word_logprobs(text: str, i: int, top: int, tops: Tops | None = None) -> list[TokenLogprob]:
    """One token per word; the log-probabilities sum to ``-i`` as ``Completion.logprob``.

    Each token has ``top`` alternatives: itself, then ``alt1``, ``alt2``... less likely;
    ``tops(text, i)`` replaces the values of the words it covers.
    """
    pieces = re.findall(r"\s*\S+", text) or [text]
    share = -float(i) / len(pieces)
    chosen = list(tops(text, i)) if tops is not None else []

    def values(j: int) -> list[float]:
        return list(chosen[j]) if j < len(chosen) else [share - a for a in range(max(1, top))]

    def alternatives(p: str, vals: list[float]) -> list[TopLogprob]:
        names = [p, *(f"alt{a}" for a in range(1, top))][:min(top, len(vals))]
        return [TopLogprob(token=t, logprob=v, bytes=list(t.encode()))
                for t, v in zip(names, vals, strict=False)]

    return [TokenLogprob(token=p, logprob=values(j)[0], bytes=list(p.encode()),
                         top_logprobs=alternatives(p, values(j))) for j, p in enumerate(pieces)]


async def _pieces(text: str, tokens: list[TokenLogprob],
                  paced: bool = False) -> AsyncIterator[Piece]:
    """``text`` word by word, each word one token, as a real engine streams it."""
    for j, word in enumerate(re.findall(r"\s*\S+", text)):
        if paced:
            await asyncio.sleep(0)
        yield Piece(word, tokens[j:j + 1] or None, 1)
