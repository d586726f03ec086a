"""A deterministic test double of the Backend protocol, for unit tests of
strategies' control flow only (system tests use the real model).

Rules map a regex (searched in the whole prompt, all turns joined) to a reply:
a string, a list of strings (sample i of a call gets item i, cycling), or a
callable ``(messages, params, i) -> str``. First matching rule wins.

    backend = ScriptedBackend([
        (r"sub-questions", '{"sub-questions": []}'),
        (r".*", ["The answer is 4.", "The answer is 5."]),
    ])
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from engine.types import Completion, Delta, Message, SamplingParams

Reply = str | list[str] | Callable[[Sequence[Message], SamplingParams, int], str]


@dataclass
class Call:
    messages: list[Message]
    params: SamplingParams
    n: int


@dataclass
class ScriptedBackend:
    rules: list[tuple[str, Reply]]
    model: str = "scripted"
    max_model_len: int = 4096
    calls: list[Call] = field(default_factory=list)

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
        text = self._reply(messages, params, i)
        words = text.split()
        finish = "stop"
        if len(words) > params.max_tokens:
            text, finish = " ".join(words[: params.max_tokens]), "length"
        return Completion(text=text, prompt_tokens=self.count_tokens(messages),
                          completion_tokens=min(len(words), params.max_tokens) or 1,
                          finish_reason=finish, logprob=-float(i) if params.logprobs else None)

    async def generate(self, messages, params, *, n=None, monitor=None) -> list[Completion]:
        n = params.n if n is None else n
        self.calls.append(Call(list(messages), params, n))
        return [self._completion(messages, params, i) for i in range(n)]

    async def stream(self, messages, params, *, monitor=None) -> AsyncIterator[Delta]:
        self.calls.append(Call(list(messages), params, 1))
        comp = self._completion(messages, params, 0)
        for piece in re.findall(r"\s*\S+", comp.text):
            yield Delta(text=piece)
        yield Delta(finish_reason=comp.finish_reason, completion=comp)

    async def aclose(self) -> None:
        pass
