"""its_hub's side of bench/vs_its_hub.py, run by the Python of its own virtualenv.

It reads one job as JSON on stdin (the algorithm and its budget, the prompts, the
upstream, and refinery's judge prompt) and runs its_hub's own algorithm on every
prompt, ``clients`` prompts at a time, against the upstream vLLM server. It prints
one JSON object: each prompt's answer text and the wall seconds of the whole pass.

The process reward its_hub's beam search, particle filtering and best-of-n use is
:class:`JudgeReward`, an adapter over refinery's judge: the same prompt and the same
one-token constrained Yes/No request to the same upstream, scored P(Yes) the same
way, each step judged once (a solution's steps are its paragraphs). This virtualenv
cannot import refinery, so the few lines that read P(Yes) are restated here.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import time

from its_hub.api import AbstractOutcomeRewardModel, AbstractProcessRewardModel
from its_hub.core.algorithms.adaptive_self_consistency import AdaptiveSelfConsistency
from its_hub.core.algorithms.beam_search import BeamSearch
from its_hub.core.algorithms.beta_self_consistency import BetaSelfConsistency
from its_hub.core.algorithms.bon import BestOfN
from its_hub.core.algorithms.particle_gibbs import ParticleFiltering
from its_hub.core.algorithms.self_consistency import SelfConsistency
from its_hub.core.lms.openai_lm import OpenAICompatibleLanguageModel
from its_hub.core.lms.step_generation import StepGeneration
from openai import AsyncOpenAI

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def final_answer(text: str) -> str:
    """The voted answer: the last ``\\boxed{}``, else the last number."""
    boxed = BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else text.strip()


class JudgeReward(AbstractProcessRewardModel, AbstractOutcomeRewardModel):
    """refinery's ``judge`` step scorer, as its_hub's process and outcome reward."""

    def __init__(self, api: AsyncOpenAI, model: str, judge: dict):
        self.api, self.model, self.judge = api, model, judge
        self.known: dict[tuple[str, tuple[str, ...]], float] = {}

    def steps(self, text: str) -> list[str]:
        sep, cap = self.judge["step_end"], self.judge["max_steps"]
        steps = [s.strip("\n") for s in text.split(sep) if s.strip()]
        if len(steps) > cap:
            steps[cap - 1:] = [sep.join(steps[cap - 1:])]
        return steps

    async def p_yes(self, question: str, steps: tuple[str, ...]) -> float:
        prompt = self.judge["prompt"].format(
            question=question, before="\n\n".join(steps[:-1]) or "(nothing yet)",
            step=steps[-1])
        r = await self.api.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": prompt}],
            temperature=0.0, max_tokens=2, logprobs=True, top_logprobs=5,
            extra_body={"structured_outputs": {"choice": self.judge["answers"]}})
        content = (r.choices[0].logprobs and r.choices[0].logprobs.content) or []
        if not content:
            return 0.5
        first, floor = content[0], self.judge["floor"]
        seen = {t.token.strip(): t.logprob for t in [first, *first.top_logprobs]}
        yes, no = (max(floor, seen.get(a, floor)) for a in self.judge["answers"])
        return 0.5 if yes == no == floor else 1.0 / (1.0 + math.exp(no - yes))

    async def last_step(self, question: str, text: str) -> float:
        """The score of the solution's last step; every earlier step judged once too,
        as refinery's judge does."""
        steps = tuple(self.steps(text))
        if not steps:
            return 1.0
        for j in range(len(steps)):
            key = (question, steps[: j + 1])
            if key not in self.known:
                self.known[key] = await self.p_yes(question, steps[: j + 1])
        return self.known[(question, steps)]

    async def ascore(self, prompt_or_messages, steps=None, **kwargs):
        if steps is not None:  # a process reward: one text per partial solution
            return list(await asyncio.gather(
                *(self.last_step(prompt_or_messages, s) for s in steps)))
        # an outcome reward: conversations (messages or dicts) ending in the candidate
        def text(m) -> str:
            return (m.get("content") if isinstance(m, dict) else m.content) or ""
        return list(await asyncio.gather(*(
            self.last_step(text(conv[0]), text(conv[-1])) for conv in prompt_or_messages)))

    def score(self, *args, **kwargs):
        return asyncio.run(self.ascore(*args, **kwargs))


def algorithm(job: dict, api: AsyncOpenAI):
    name = job["algorithm"]
    if name in ("sc", "sc16"):
        return SelfConsistency(final_answer)
    if name == "beta":  # all requests at once, cancelled once the Beta test holds
        return BetaSelfConsistency(consistency_space_projection_func=final_answer)
    if name == "adaptive":  # rounds of 2, 2, 4, 8 until a 75% supermajority
        return AdaptiveSelfConsistency(consistency_space_projection_func=final_answer)
    reward = JudgeReward(api, job["model"], job["judge"])
    if name == "bon":
        return BestOfN(reward)
    # its_hub counts the step it stops on past max_steps: one fewer gives refinery's count.
    sg = StepGeneration(max_steps=job["max_steps"] - 1, step_token=job["judge"]["step_end"],
                        stop_token="boxed", temperature=job["step_temperature"])
    if name == "beam":
        return BeamSearch(sg, reward, beam_width=job["beam_width"])
    return ParticleFiltering(sg, reward, resampling_method="multinomial")


async def run(job: dict) -> dict:
    api = AsyncOpenAI(base_url=job["endpoint"], api_key="sk-bench", timeout=3600,
                      max_retries=0)
    step = job["algorithm"] in ("beam", "particle")
    lm = OpenAICompatibleLanguageModel(
        endpoint=job["endpoint"], api_key="sk-bench", model_name=job["model"],
        max_tokens=job["step_tokens"] if step else job["max_tokens"],
        temperature=job["step_temperature"] if step else job["temperature"])
    alg, gate = algorithm(job, api), asyncio.Semaphore(job["clients"])
    texts: list[str | None] = [None] * len(job["prompts"])
    errors: list[str] = []

    async def one(i: int, prompt: str) -> None:
        async with gate:
            asked = prompt if step else [{"role": "user", "content": prompt}]
            try:
                out = await alg.ainfer(lm, asked, budget=job["budget"])
            except Exception as exc:  # a failure is a figure, not a crash
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            texts[i] = out.get("content") or ""

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, p) for i, p in enumerate(job["prompts"])))
    wall = time.perf_counter() - t0
    await lm.close()
    await api.close()
    return {"texts": texts, "wall_seconds": wall, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(json.load(sys.stdin)))))
