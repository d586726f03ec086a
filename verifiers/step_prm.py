"""A process reward model: a classifier trained on step labels, served by vLLM.

The judge asks the policy model about each step and the calculator checks only
arithmetic; a PRM (Qwen2.5-Math-PRM, Math-Shepherd, Skywork-PRM) was trained to
say, after every step, how likely the solution still is to be right. It reads a
whole partial solution at once: the question, then the steps, each followed by
the family's step tag. Its per-token classifier gives, at each tag, a row of
class probabilities (``[P(wrong), P(right)]`` for Qwen); a step's score is its
tag's P(right). vLLM serves such a model with its pooling runner (``vllm serve
Qwen/Qwen2.5-Math-PRM-7B --runner pooling``) at ``POST /pooling``, which takes
a list of texts, so every path of a search level goes in one request. With
step pooling (``tok_pooling_type: STEP``) the server returns only the rows at
the tags; with ``ALL`` it returns every token's row and the tags are found
through ``POST /tokenize``.

What differs between families lives in a :class:`PRMFormat`: another family is
another instance, not another scorer.

Example:
    >>> scorer = PRMStepScorer("http://127.0.0.1:8000", "Qwen/Qwen2.5-Math-PRM-7B")
    >>> await scorer.score(task, [["3 + 4 = 7."], ["3 + 4 = 8."]], ctx)  # doctest: +SKIP
    [[0.97], [0.08]]
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from refinery.engine.backends.upstream_guard import RETRY_STATUS
from refinery.engine.context import Context
from refinery.engine.errors import BackendError, BackendUnavailableError, SpecError
from refinery.engine.types import Task

__all__ = ["CHATML", "ENV_API_KEY", "ENV_FORMAT", "ENV_MODEL", "ENV_TIMEOUT", "ENV_URL",
           "FORMATS", "QWEN_MATH_PRM", "PRMFormat", "PRMStepScorer"]

ENV_URL, ENV_MODEL, ENV_API_KEY = "REFINERY_PRM_URL", "REFINERY_PRM_MODEL", "REFINERY_PRM_API_KEY"
ENV_FORMAT, ENV_TIMEOUT = "REFINERY_PRM_FORMAT", "REFINERY_PRM_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
# What apply_chat_template renders for a ChatML model given system, user and a
# finished assistant turn (no generation prompt): Qwen2.5's template, SmolLM2's too.
CHATML = ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
          "<|im_start|>assistant\n{steps}<|im_end|>\n")


@dataclass(frozen=True)
class PRMFormat:
    """How one PRM family reads a partial solution and where its scores are.

    ``template`` has ``{system}``, ``{question}`` and ``{steps}``; the steps are
    written each followed by ``step_tag``. ``right`` is the column of a tag's row
    holding P(right). ``server_pools_steps``: the server returns only the rows at
    the tags (vLLM's STEP pooling); otherwise it returns every token's row and
    ``step_tag_id``, the tag's token id, finds them.
    """

    template: str
    system: str
    step_tag: str
    right: int = 1
    server_pools_steps: bool = True
    step_tag_id: int | None = None

    def __post_init__(self) -> None:
        if not self.server_pools_steps and self.step_tag_id is None:
            raise ValueError("a PRM format whose server returns every token needs step_tag_id")

    def render(self, question: str, steps: Sequence[str]) -> str:
        """The model's input: the template around the steps, a tag after each.

        A tag inside a step's own text would be read as a step end and shift every
        later score, so it is replaced by a space.
        """
        body = "".join(s.replace(self.step_tag, " ") + self.step_tag for s in steps)
        return self.template.format(system=self.system, question=question, steps=body)


QWEN_MATH_PRM = PRMFormat(
    template=CHATML,
    system="Please reason step by step, and put your final answer within \\boxed{}.",
    step_tag="<extra_0>",
    right=1,  # its rows are [P(wrong), P(right)]
    step_tag_id=151651,  # <extra_0>; vLLM's step pooling defaults to it for this model
)

FORMATS: dict[str, PRMFormat] = {"qwen-math": QWEN_MATH_PRM}


# The parts of vLLM's replies read here (PoolingResponse, TokenizeResponse).
class _Rows(BaseModel):
    index: int
    data: list[list[float]]


class _Pooled(BaseModel):
    data: list[_Rows]


class _Tokens(BaseModel):
    tokens: list[int]


_Reply = TypeVar("_Reply", _Pooled, _Tokens)


class PRMStepScorer:
    """``prm``: each step's P(right) from a process reward model behind vLLM's /pooling.

    ``base_url`` is the server's root (a trailing ``/v1`` is dropped: vLLM serves
    /pooling and /tokenize beside it, not under it). ``model`` may be None when
    the server serves one model. Stateless: a step's score depends only on the
    text up to its tag, so nothing of a solve needs keeping.
    """

    name = "prm"

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 fmt: PRMFormat = QWEN_MATH_PRM, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model, self.fmt, self.timeout = model, fmt, timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PRMStepScorer:
        """The scorer the environment configures: ``REFINERY_PRM_URL`` (required),
        ``REFINERY_PRM_MODEL``, ``REFINERY_PRM_API_KEY``, ``REFINERY_PRM_FORMAT``
        (a name in :data:`FORMATS`, default ``qwen-math``), ``REFINERY_PRM_TIMEOUT``
        (seconds, default 60).

        Raises:
            SpecError: no URL, an unknown format or a timeout that is no positive number.
        """
        env = os.environ if env is None else env
        url = env.get(ENV_URL, "").strip()
        if not url:
            raise SpecError(f"the prm step scorer needs a PRM server: set {ENV_URL} to the "
                            "root URL of a vLLM pooling server (vllm serve MODEL --runner "
                            "pooling)", param="scorer")
        name = env.get(ENV_FORMAT, "").strip() or "qwen-math"
        if name not in FORMATS:
            raise SpecError(f"{ENV_FORMAT}={name!r} is no PRM format; known: "
                            f"{', '.join(sorted(FORMATS))}", param="scorer")
        raw = env.get(ENV_TIMEOUT, "").strip() or str(DEFAULT_TIMEOUT)
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
        if not timeout > 0:
            raise SpecError(f"{ENV_TIMEOUT}={raw!r} is no positive number of seconds",
                            param="scorer")
        return cls(url, env.get(ENV_MODEL, "").strip() or None,
                   api_key=env.get(ENV_API_KEY, "").strip() or None,
                   fmt=FORMATS[name], timeout=timeout)

    async def score(self, task: Task, paths: Sequence[Sequence[str]],
                    ctx: Context | None) -> list[list[float]]:
        """``result[i][j]``: P(right) at the tag after step ``j`` of ``paths[i]``; ``ctx``
        unused (the PRM is not the policy model, and its calls spend no budget).

        Raises:
            BackendUnavailableError: the server is unreachable, timed out or overloaded.
            BackendError: it refused the request or answered something malformed.
        """
        if not paths:
            return []
        texts = [self.fmt.render(task.question, p) for p in paths]
        async with httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                     timeout=self.timeout) as client:
            rows = await self._pool(client, texts)
            if not self.fmt.server_pools_steps:
                rows = await asyncio.gather(*(self._at_tags(client, t, r)
                                              for t, r in zip(texts, rows, strict=True)))
        return [self._scores(rows[i], len(p), i) for i, p in enumerate(paths)]

    async def _pool(self, client: httpx.AsyncClient, texts: list[str]) -> list[list[list[float]]]:
        """One /pooling request for all texts: each text's rows, in the texts' order."""
        body: dict[str, object] = {"input": texts, "task": "token_classify",
                                   "use_activation": True, "add_special_tokens": True}
        if self.model is not None:
            body["model"] = self.model
        reply = self._parse(_Pooled, await self._post(client, "/pooling", body), "/pooling")
        indices = sorted(item.index for item in reply.data)
        if indices != list(range(len(texts))):
            raise BackendError(f"PRM server {self.base_url} answered /pooling with indices "
                               f"{indices[:10]} for {len(texts)} inputs")
        return [item.data for item in sorted(reply.data, key=lambda item: item.index)]

    async def _at_tags(self, client: httpx.AsyncClient, text: str,
                       rows: list[list[float]]) -> list[list[float]]:
        """The rows at the step tags, of a reply that has one row per token."""
        body: dict[str, object] = {"prompt": text, "add_special_tokens": True}
        if self.model is not None:
            body["model"] = self.model
        ids = self._parse(_Tokens, await self._post(client, "/tokenize", body), "/tokenize")
        if len(ids.tokens) != len(rows):
            raise BackendError(f"PRM server {self.base_url} pooled {len(rows)} rows for a text "
                               f"of {len(ids.tokens)} tokens: is its pooling ALL?")
        return [row for tok, row in zip(ids.tokens, rows, strict=True)
                if tok == self.fmt.step_tag_id]

    async def _post(self, client: httpx.AsyncClient, route: str, body: dict[str, object]) -> bytes:
        try:
            resp = await client.post(route, json=body)
        except httpx.HTTPError as exc:  # connection refused, reset, timeouts
            raise BackendUnavailableError(
                f"PRM server {self.base_url} failed on {route}: {exc!r}") from exc
        if resp.status_code >= 400:
            # A status a retry may fix (overload, a restart) is "unavailable", as the
            # chat backends report their upstreams.
            cls = BackendUnavailableError if resp.status_code in RETRY_STATUS else BackendError
            raise cls(f"PRM server {self.base_url} answered {resp.status_code} on {route}: "
                      f"{resp.text[:300]}")
        return resp.content

    def _parse(self, model: type[_Reply], content: bytes, route: str) -> _Reply:
        try:
            return model.model_validate_json(content, strict=True)
        except ValidationError as exc:
            # One list per input rather than rows: a sequence task (classify, embed).
            raise BackendError(f"PRM server {self.base_url} answered {route} with a malformed "
                               f"body (is its pooling task token_classify?): "
                               f"{exc.errors(include_url=False)[:2]}") from exc

    def _scores(self, rows: list[list[float]], steps: int, path: int) -> list[float]:
        """P(right) of each step of path ``path``, checked: one row a step, a probability."""
        if len(rows) != steps:
            raise BackendError(f"PRM server {self.base_url} gave {len(rows)} step rows for path "
                               f"{path}'s {steps} steps (is the step tag one token of its "
                               f"tokenizer, and the input within its context?)")
        right = self.fmt.right
        out = []
        for row in rows:
            p = row[right] if len(row) > right else math.nan
            if not 0.0 <= p <= 1.0:  # also NaN
                raise BackendError(f"PRM server {self.base_url} gave the row {row[:4]} for path "
                                   f"{path}: column {right} is no probability")
            out.append(p)
        return out
