"""How many tokens of ``sc(cot, n=5)``'s work an earlier stop could save.

``bench/vs_optillm.py`` finds refinery's layer at parity with vLLM's own server,
so the in-process side can only get faster than the engine by generating less.
This samples the request that spec makes (cot's messages, sc's ``n`` and
temperature) for the first ``--questions`` GSM8K test questions from one vLLM
server (refinery's engine settings and dtype) and counts, over all samples:

- how many ran to ``--max-tokens`` (a vote cannot be settled early when the
  samples end together, since they decode in one batch);
- how many the loop detector (refinery's default, the CUSUM monitor) would stop,
  fed each whole text as it stops a stream, and the tokens after its cuts: what
  streaming each sample and cutting it would save;
- the questions whose vote is settled before the last sample ends (a majority
  that the unfinished samples cannot overturn), and the tokens still to come then
  (the samples end in order of length, as they do in one batch).

    python bench/sc_headroom.py [--questions 32] [--max-tokens 128] [--spec "sc(cot, n=5)"]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_optillm as vo  # noqa: E402  (sets the vLLM environment of the other benches)

from refinery.engine.loops import CusumLoopDetector  # noqa: E402
from refinery.engine.stops import WatchedSample  # noqa: E402
from refinery.verifiers.math import extract_answer, normalize_answer  # noqa: E402

Sample = tuple[str, int]  # text, tokens generated


async def sample_all(ask: vo.Ask, questions: list[str], max_tokens: int) -> list[list[Sample]]:
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=vo.url("vllm"), api_key="sk-bench", timeout=3600, max_retries=0)
    gate = asyncio.Semaphore(16)

    async def one(question: str) -> list[Sample]:
        async with gate:
            r = await api.chat.completions.create(max_tokens=max_tokens, logprobs=True,
                                                  **ask.request(question))
        return [(c.message.content or "", len(c.logprobs.content)) for c in r.choices]

    try:
        return await asyncio.gather(*(one(q) for q in questions))
    finally:
        await api.close()


def tokens_after_cut(text: str, tokens: int, tokenizer) -> int | None:
    """Tokens generated after the loop detector's cut of ``text`` (None: no stop)."""
    watch = WatchedSample(CusumLoopDetector())
    watch.add(text)
    if watch.stop is None:
        return None
    return max(0, tokens - len(tokenizer.encode(watch.text, add_special_tokens=False)))


def settled_saving(samples: list[Sample]) -> int | None:
    """Tokens still to come when the vote is settled (None: only at the last sample)."""
    done = sorted(samples, key=lambda s: s[1])
    votes: Counter[str] = Counter()
    for i, (text, tokens) in enumerate(done[:-1]):
        answer = extract_answer(text)
        if answer:
            votes[normalize_answer(answer)] += 1
        left = len(done) - i - 1
        ranked = votes.most_common(2) + [("", 0)] * 2
        if ranked[0][1] > ranked[1][1] + left:
            return sum(t - tokens for _, t in done[i + 1:])
    return None


def report(results: list[list[Sample]], max_tokens: int, tokenizer) -> None:
    flat = [s for samples in results for s in samples]
    total = sum(t for _, t in flat)
    cuts = [c for c in (tokens_after_cut(x, t, tokenizer) for x, t in flat) if c is not None]
    settled = [s for s in (settled_saving(samples) for samples in results) if s is not None]
    print(f"{len(flat)} samples of {len(results)} questions, {total} tokens generated")
    print(f"at the {max_tokens}-token cap: {sum(t >= max_tokens for _, t in flat)}")
    print(f"loop stops: {len(cuts)}; tokens after their cuts {sum(cuts)} "
          f"({sum(cuts) / total:.1%} of all)")
    print(f"votes settled before the last sample: {len(settled)}; tokens still to come "
          f"then {sum(settled)} ({sum(settled) / total:.1%} of all)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--spec", default=vo.SPEC)
    a = ap.parse_args()
    ask = vo.spec_request(a.spec)
    questions = [q for q, _ in vo.load_work(a.questions)]
    server = vo.vllm_server(Path(tempfile.mkdtemp(prefix="sc-headroom-")))
    try:
        server.wait_ready(vo.url("vllm", "/health"))
        results = asyncio.run(sample_all(ask, questions, a.max_tokens))
    finally:
        server.stop()
    from transformers import AutoTokenizer

    from refinery.engine.models import resolve_model

    report(results, a.max_tokens, AutoTokenizer.from_pretrained(resolve_model(vo.DEFAULT_MODEL)))


if __name__ == "__main__":
    main()
