"""Backend for any OpenAI-compatible server (vLLM's server, a router, OpenAI).

Several base URLs are used round-robin (a cluster of vLLM servers without a
router). A semaphore caps requests in flight. Retries (tenacity, exponential
backoff with jitter) cover 408/409/429/5xx and connection errors; the SDK's
own retries are turned off so there is one retry policy, not two stacked.
Cancelling a call closes its HTTP stream, which makes vLLM abort the request.

Example:
    >>> backend = OpenAIBackend("smollm2-135m", base_urls=["http://127.0.0.1:8001/v1"])
    >>> [c] = await backend.generate([Message(role="user", content="Hi")], SamplingParams())
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import openai
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from engine.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidRequestError,
    PromptTooLongError,
    UnknownModelError,
)
from engine.loops import LoopDetector, cut_at_onset
from engine.types import Completion, Delta, Message, SamplingParams

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code in RETRY_STATUS


class OpenAIBackend:
    """Backend over the ``openai`` SDK. ``served_model`` is the upstream model id."""

    def __init__(self, model: str, base_urls: Sequence[str] | str, *, api_key: str = "EMPTY",
                 served_model: str | None = None, max_concurrency: int = 64,
                 max_retries: int = 5, max_retry_seconds: float = 60.0,
                 timeout: float = 600.0, max_model_len: int = 4096,
                 backoff_initial: float = 0.5, backoff_max: float = 8.0):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise InvalidRequestError("OpenAIBackend needs at least one base URL",
                                      param="base_url")
        self.model = model
        self.served_model = served_model or model
        self.max_model_len = max_model_len
        self.clients = [openai.AsyncOpenAI(base_url=u, api_key=api_key, max_retries=0,
                                           timeout=timeout) for u in urls]
        self._next = itertools.cycle(range(len(self.clients)))
        self._sem = asyncio.Semaphore(max_concurrency)
        self._retry = dict(
            retry=retry_if_exception(_retryable),
            stop=stop_after_attempt(max_retries + 1) | stop_after_delay(max_retry_seconds),
            wait=wait_exponential_jitter(multiplier=backoff_initial, max=backoff_max),
            reraise=True,
        )

    def count_tokens(self, messages: Sequence[Message]) -> int:
        # No tokenizer here: a rough bound (4 chars/token) that is only used for
        # pre-flight checks; the server's usage numbers are the real counts.
        return sum(len(m.content) // 4 + 4 for m in messages)

    def _kwargs(self, messages: Sequence[Message], params: SamplingParams, n: int) -> dict:
        kw: dict[str, Any] = dict(
            model=self.served_model,
            messages=[{"role": m.role, "content": m.content} for m in messages],
            temperature=params.temperature, top_p=params.top_p,
            max_tokens=params.max_tokens, n=n)
        if params.stop:
            kw["stop"] = params.stop
        if params.seed is not None:
            kw["seed"] = params.seed
        if params.logprobs:
            kw["logprobs"] = True
        return kw

    async def _call(self, fn):
        """Run ``fn(client)`` under the concurrency cap with the retry policy."""
        try:
            async with self._sem:
                async for attempt in AsyncRetrying(**self._retry):
                    with attempt:
                        return await fn(self.clients[next(self._next)])
        except openai.NotFoundError as exc:
            raise UnknownModelError(f"upstream does not serve {self.served_model!r}: "
                                    f"{exc.message}", param="model") from exc
        except openai.BadRequestError as exc:
            msg = exc.message or str(exc)
            if "context" in msg.lower() and "length" in msg.lower():
                raise PromptTooLongError(msg, param="messages",
                                         code="context_length_exceeded") from exc
            raise InvalidRequestError(msg) from exc
        except openai.APIConnectionError as exc:
            raise BackendUnavailableError(f"upstream unreachable after retries: {exc}") from exc
        except openai.APIStatusError as exc:
            cls = BackendUnavailableError if exc.status_code in RETRY_STATUS else BackendError
            raise cls(f"upstream answered {exc.status_code} after retries: "
                      f"{exc.message}") from exc

    async def generate(self, messages: Sequence[Message], params: SamplingParams, *,
                       n: int | None = None,
                       monitor: LoopDetector | None = None) -> list[Completion]:
        n = params.n if n is None else n
        if n < 1:
            raise InvalidRequestError(f"n must be >= 1, got {n}", param="n")
        if monitor is not None:
            # A looping sample must be stopped alone, so each sample is streamed.
            return list(await asyncio.gather(
                *(self._one_streamed(messages, params, monitor) for _ in range(n))))
        resp = await self._call(
            lambda c: c.chat.completions.create(**self._kwargs(messages, params, n)))
        usage = resp.usage
        per_sample = (usage.completion_tokens // max(1, n)) if usage else 0
        out = []
        for ch in sorted(resp.choices, key=lambda c: c.index):
            lp = None
            if params.logprobs and ch.logprobs and ch.logprobs.content:
                lp = sum(t.logprob for t in ch.logprobs.content)
            out.append(Completion(
                text=ch.message.content or "",
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=(len(ch.logprobs.content) if ch.logprobs and
                                   ch.logprobs.content else per_sample),
                finish_reason=_finish(ch.finish_reason), logprob=lp))
        return out

    async def _one_streamed(self, messages, params, monitor) -> Completion:
        last = None
        async for d in self.stream(messages, params, monitor=monitor):
            last = d
        assert last is not None and last.completion is not None
        return last.completion

    async def stream(self, messages: Sequence[Message], params: SamplingParams, *,
                     monitor: LoopDetector | None = None) -> AsyncIterator[Delta]:
        kw = self._kwargs(messages, params, 1)
        kw.update(stream=True, stream_options={"include_usage": True})
        # Retries cover opening the stream; a failure mid-stream is raised, since
        # replaying would duplicate text the caller has already seen.
        stream = await self._call(lambda c: c.chat.completions.create(**kw))
        mon = monitor.new() if monitor is not None else None
        text, finish, onset, usage, n_chunks = "", None, None, None, 0
        try:
            async for chunk in stream:
                if chunk.usage:
                    usage = chunk.usage
                if not chunk.choices:
                    continue
                ch = chunk.choices[0]
                piece = ch.delta.content or ""
                n_chunks += bool(piece)
                alarm = mon.feed(piece) if (mon is not None and piece) else None
                if alarm is not None:
                    onset, kept = cut_at_onset(text, piece, alarm)
                    if kept:
                        yield Delta(text=kept)
                    text, finish = (text + piece)[:onset], "loop"
                    break
                text += piece
                if piece:
                    yield Delta(text=piece)
                if ch.finish_reason:
                    finish = ch.finish_reason
        except openai.APIError as exc:
            raise BackendUnavailableError(f"upstream stream broke: {exc}") from exc
        finally:
            # Closing the HTTP response is how an OpenAI-compatible server learns
            # to abort the request (early stop, loop alarm, or our cancellation).
            await stream.close()
        comp = Completion(
            text=text, prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else n_chunks,
            finish_reason=_finish(finish), loop_onset=onset)
        yield Delta(finish_reason=comp.finish_reason, completion=comp)

    async def aclose(self) -> None:
        for c in self.clients:
            await c.close()


def _finish(reason: str | None) -> str:
    if reason in ("stop", "length", "loop", "abort"):
        return reason
    if reason is None:
        return "abort"
    return "stop"  # tool_calls, content_filter...: the text ended normally
