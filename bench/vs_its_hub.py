"""Test-time scaling through its_hub and through refinery, side by side in one run.

For each algorithm, the same algorithm with the same scorer on the same vLLM
upstream and the same problems, one side after the other (odd rounds in the
mirrored order), the server's prefix cache emptied before each timed pass:

1. **its_hub**: its_hub 1.2.0's own algorithm (its own virtualenv, ``make
   bench-peers``; ``bench/its_hub_side.py``), ``clients`` problems at a time, as a
   library against vLLM's own OpenAI server. Its process reward is an adapter over
   refinery's judge: the same prompt and constrained one-token Yes/No request, P(Yes);
2. **refinery**: ``refinery serve --backend vllm-server`` in front of the same vLLM
   server, ``clients`` concurrent official ``openai`` clients asking for the spec;
3. **floor**, a reference, not a competitor: vLLM's server asked directly, per
   problem and all at once, for as many requests and generated tokens as refinery's
   pass made (each request ``ignore_eos`` to its share of the tokens): the engine's
   own time for that volume with no search, no levels and no layer in front;
4. **replay**, the floor that keeps the algorithm's order: every generation of
   refinery's pass (read from its full trace), each sample with its own prompt
   (a continued assistant turn continued) and its own token count, in the order
   the algorithm needs them: calls that ran together are sent together, a call
   that waited for others waits for their replay. The engine's time for the
   same calls in the same dependency order with nothing in front. It sends one
   request per sample, so a layer that asks for n samples in one request (and
   shares their prompt) can come in a few percent under it.

========  ================================================  ===========================
name      refinery                                          its_hub
========  ================================================  ===========================
sc        ``sc(cot, n=8)``                                  ``SelfConsistency``, budget 8
sc16      ``sc(cot, n=16)``                                 ``SelfConsistency``, budget 16
beta      ``asc(cot, max_n=16, against="runner_up")``       ``BetaSelfConsistency``, budget 16
adaptive  ``asc(cot, max_n=16)``                            ``AdaptiveSelfConsistency``, budget 16
bon       ``best_of_n(cot, n=4, step_scorer="judge")``      ``BestOfN``, budget 4
beam      ``beam(scorer="judge", width=2, expand=2)``       ``BeamSearch``, width 2, budget 4
particle  ``particle(scorer="judge", n=4)``                 ``ParticleFiltering``, budget 4
========  ================================================  ===========================

Per side: wall seconds, HTTP requests the vLLM server answered and tokens it
generated (its ``/metrics``), and how many answers were right (refinery's math
checker on both sides). Printed: each algorithm's refinery/its_hub wall ratio, and
the floor's share of each side's wall; for the adaptive votes (``beta``,
``adaptive``) run beside ``sc16``, how often each side's answer is the answer of its
own side's full 16-sample vote on the same problem.

    make bench-peers   # once: its_hub into $REFINERY_HOME/peers/its_hub
    python bench/vs_its_hub.py [--problems 32] [--clients 16] [--rounds 1]
                               [--algorithms sc bon beam particle]
    python bench/vs_its_hub.py --algorithms sc16 beta adaptive   # the adaptive votes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_optillm import GEN_TOKENS, PORTS, Service, scrape, url, vllm_server  # noqa: E402

from refinery.engine.models import DEFAULT_MODEL, refinery_home  # noqa: E402
from refinery.engine.types import Message, Task  # noqa: E402
from refinery.eval.datasets import load_arith  # noqa: E402
from refinery.strategies.base import with_question  # noqa: E402
from refinery.strategies.cot import CoT  # noqa: E402
from refinery.strategies.step_search import INSTRUCTION, SearchParams  # noqa: E402
from refinery.verifiers.math import extract_answer, is_equivalent  # noqa: E402
from refinery.verifiers.step_judge import ANSWERS, FLOOR, JUDGE_PROMPT  # noqa: E402
from refinery.verifiers.steps import MAX_STEPS, STEP_END  # noqa: E402

HTTP_REQUESTS = re.compile(
    r'^http_requests_total\{[^}]*handler="/v1/chat/completions"[^}]*\}\s+([0-9.e+]+)', re.M)
ITS_HUB_PYTHON = refinery_home() / "peers" / "its_hub" / "bin" / "python"
SIDE_SCRIPT = Path(__file__).resolve().parent / "its_hub_side.py"
MAX_STEPS_SEARCH = 6
SEARCH = SearchParams()


@dataclass(frozen=True)
class Algorithm:
    """One algorithm on both sides: refinery's spec and its_hub's budget."""

    spec: str
    budget: int
    stepwise: bool = False  # a step search: the search's prompt, not cot's
    beam_width: int = 0


ALGORITHMS = {
    "sc": Algorithm("sc(cot, n=8)", 8),
    "sc16": Algorithm("sc(cot, n=16)", 16),
    "beta": Algorithm('asc(cot, max_n=16, against="runner_up")', 16),
    "adaptive": Algorithm("asc(cot, max_n=16)", 16),
    "bon": Algorithm('best_of_n(cot, n=4, step_scorer="judge")', 4),
    "beam": Algorithm(f'beam(scorer="judge", width=2, expand=2, max_steps={MAX_STEPS_SEARCH})',
                      4, stepwise=True, beam_width=2),
    "particle": Algorithm(f'particle(scorer="judge", n=4, max_steps={MAX_STEPS_SEARCH}, '
                          'resampling="multinomial")', 4, stepwise=True),
}


@dataclass
class Side:
    """What one side did with one algorithm's work."""

    name: str
    algorithm: str
    wall_seconds: float = 0.0
    requests: float = 0.0
    generated_tokens: float = 0.0
    correct: int = 0
    errors: list[str] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)  # extracted, per problem
    traces: list[list[dict]] = field(default_factory=list, repr=False)  # refinery's, per problem


@dataclass(frozen=True)
class Call:
    """One sample a trace recorded: the turn it continued and the tokens it generated."""

    messages: tuple[tuple[str, str], ...]
    tokens: int


def phases(trace: dict) -> list[list[Call]]:
    """A solve's samples grouped as they ran: generations that overlapped in time ran
    together; one that started after all of a group had ended waited for that group."""
    events = sorted((e for e in trace["events"] if e["kind"] == "generation"),
                    key=lambda e: e["time"] - e["seconds"])
    # A loop retry records no prompt: it re-asks its parent's turn (plus a nudge).
    asked = {e["id"]: e["messages"] for e in events if e["messages"]}
    out: list[list[Call]] = []
    end = float("-inf")
    for e in events:
        messages = e["messages"] or asked.get((e["parents"] or [""])[0])
        if not messages:
            continue
        start = e["time"] - e["seconds"]
        if start >= end:
            out.append([])
            end = e["time"]
        else:
            end = max(end, e["time"])
        turn = tuple((m["role"], m["content"] or "") for m in messages)
        out[-1] += [Call(turn, max(1, c["completion_tokens"])) for c in e["completions"]]
    return out


def shown(side: Side) -> str:
    """One side's figures as a JSON line, without its traces."""
    return json.dumps({k: v for k, v in asdict(side).items() if k != "traces"})


def prompt(question: str, algo: Algorithm) -> str:
    """The user turn both sides send for ``question``: cot's, or the step search's."""
    msgs = [Message(role="user", content=question)]
    if algo.stepwise:
        return with_question(msgs, INSTRUCTION)[-1].content
    return CoT().messages(Task(messages=msgs))[-1].content


def grade(side: Side, texts: list[str | None], golds: list[str]) -> None:
    side.answers = [extract_answer(t) if t else None for t in texts]
    for text, gold in zip(texts, golds, strict=True):
        side.correct += bool(text) and is_equivalent(extract_answer(text), gold)


async def timed(side: Side, work) -> list[str | None]:
    """Runs ``work`` with the server's counters read around it; fills ``side``."""
    async with httpx.AsyncClient(timeout=30) as http:
        (await http.post(url("vllm", "/reset_prefix_cache"))).raise_for_status()
    metrics = url("vllm", "/metrics")
    tokens, requests = scrape(metrics, GEN_TOKENS), scrape(metrics, HTTP_REQUESTS)
    t0 = time.perf_counter()
    texts = await work()
    side.wall_seconds = side.wall_seconds or time.perf_counter() - t0
    side.generated_tokens = scrape(metrics, GEN_TOKENS) - tokens
    side.requests = scrape(metrics, HTTP_REQUESTS) - requests
    return texts


def its_hub_job(name: str, algo: Algorithm, prompts: list[str], a: argparse.Namespace) -> dict:
    return {"algorithm": name, "budget": algo.budget, "beam_width": algo.beam_width,
            "endpoint": url("vllm"), "model": DEFAULT_MODEL, "prompts": prompts,
            "clients": a.clients, "max_tokens": a.max_tokens, "temperature": 0.7,
            "step_temperature": SEARCH.temperature, "step_tokens": SEARCH.step_tokens,
            "max_steps": MAX_STEPS_SEARCH,
            "judge": {"prompt": JUDGE_PROMPT, "answers": list(ANSWERS), "floor": FLOOR,
                      "step_end": STEP_END, "max_steps": MAX_STEPS}}


async def its_hub_side(name: str, algo: Algorithm, prompts: list[str],
                       a: argparse.Namespace, side: Side) -> list[str | None]:
    job = json.dumps(its_hub_job(name, algo, prompts, a))
    done = await asyncio.to_thread(subprocess.run, [str(ITS_HUB_PYTHON), str(SIDE_SCRIPT)],
                                   input=job, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"its_hub side failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    side.wall_seconds, side.errors = out["wall_seconds"], out["errors"]
    return out["texts"]


async def refinery_side(algo: Algorithm, prompts: list[str], a: argparse.Namespace,
                        side: Side) -> list[str | None]:
    from openai import AsyncOpenAI

    api = AsyncOpenAI(base_url=url("refinery"), api_key="sk-bench", timeout=3600,
                      max_retries=0)
    gate = asyncio.Semaphore(a.clients)

    async def one(text: str) -> str | None:
        async with gate:
            try:
                r = await api.chat.completions.create(
                    model=f"{algo.spec}@{DEFAULT_MODEL}", max_tokens=a.max_tokens,
                    messages=[{"role": "user", "content": text}],
                    extra_body={"refinery": {"trace": "full"}})
            except Exception as exc:  # a side's failure is a figure, not a crash
                side.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return None
            side.traces.append((r.model_extra or {}).get("refinery", {}).get("trace") or [])
            return r.choices[0].message.content

    try:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    finally:
        await api.close()


async def floor_side(prompts: list[str], like: Side, a: argparse.Namespace) -> None:
    """As many requests and generated tokens as ``like``, problem by problem at once."""
    per_problem = max(1, round(like.requests / len(prompts)))
    tokens = max(1, round(like.generated_tokens / max(like.requests, 1)))
    gate = asyncio.Semaphore(a.clients)
    async with httpx.AsyncClient(timeout=3600) as http:
        async def one(text: str) -> None:
            body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": text}],
                    "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
                    "temperature": 0.8}
            async with gate:
                await asyncio.gather(*(http.post(url("vllm", "/v1/chat/completions"),
                                                 json=body) for _ in range(per_problem)))

        await asyncio.gather(*(one(p) for p in prompts))


async def replay_side(like: Side, a: argparse.Namespace) -> None:
    """Every sample of ``like``'s traces again, group after group, problems ``clients``
    at a time."""
    gate = asyncio.Semaphore(a.clients)
    async with httpx.AsyncClient(timeout=3600) as http:
        async def call(c: Call) -> None:
            body = {"model": DEFAULT_MODEL, "max_tokens": c.tokens, "min_tokens": c.tokens,
                    "ignore_eos": True, "temperature": 0.8,
                    "messages": [{"role": r, "content": t} for r, t in c.messages]}
            if c.messages[-1][0] == "assistant":
                body |= {"continue_final_message": True, "add_generation_prompt": False}
            (await http.post(url("vllm", "/v1/chat/completions"), json=body)).raise_for_status()

        async def solve(traces: list[dict]) -> None:
            async with gate:
                for trace in traces:
                    for group in phases(trace):
                        await asyncio.gather(*(call(c) for c in group))

        await asyncio.gather(*(solve(t) for t in like.traces))


def run_algorithm(name: str, rnd: int, problems: list, warmup: list,
                  a: argparse.Namespace) -> list[Side]:
    """Both sides on ``problems`` (each first on ``warmup``, untimed), then the floor
    and the replay of refinery's calls."""
    algo = ALGORITHMS[name]
    golds = [e.gold for e in problems]
    # refinery's strategies add their own instruction: they are sent the bare question;
    # its_hub is sent the turn refinery's strategy makes of it.
    questions = [e.prompt for e in problems]
    prompts = [prompt(q, algo) for q in questions]
    warm_q = [e.prompt for e in warmup]
    warm_p = [prompt(q, algo) for q in warm_q]
    sides: list[Side] = []
    order = ["its_hub", "refinery"][:: -1 if rnd % 2 else 1]
    for who in order:
        side = Side(who, name)
        if who == "its_hub":
            asyncio.run(its_hub_side(name, algo, warm_p, a, Side(who, name)))
            work = lambda s=side: its_hub_side(name, algo, prompts, a, s)  # noqa: E731
        else:
            asyncio.run(refinery_side(algo, warm_q, a, Side(who, name)))
            work = lambda s=side: refinery_side(algo, questions, a, s)  # noqa: E731
        grade(side, asyncio.run(timed(side, work)), golds)
        sides.append(side)
        print(shown(side), flush=True)
    ref = next(s for s in sides if s.name == "refinery")
    floor, replay = Side("floor", name), Side("replay", name)
    asyncio.run(timed(floor, lambda: floor_side(prompts, ref, a)))
    asyncio.run(timed(replay, lambda: replay_side(ref, a)))
    for s in (floor, replay):
        print(shown(s), flush=True)
    return [*sides, floor, replay]


def report(sides: list[Side], a: argparse.Namespace) -> None:
    print(f"\n{a.problems} arith problems, {a.clients} at a time, max_tokens {a.max_tokens}")
    print(f"{'algorithm':<9} {'side':<9} {'wall s':>8} {'requests':>9} {'generated':>10} "
          f"{'right':>6} errors")
    for s in sides:
        print(f"{s.algorithm:<9} {s.name:<9} {s.wall_seconds:>8.1f} {s.requests:>9.0f} "
              f"{s.generated_tokens:>10.0f} {s.correct:>6} {len(s.errors)}")
    for name in a.algorithms:
        walls = {w: statistics.mean(s.wall_seconds for s in sides
                                    if s.algorithm == name and s.name == w)
                 for w in ("its_hub", "refinery", "floor", "replay")}
        print(f"{name}: wall refinery/its_hub {walls['refinery'] / walls['its_hub']:.3f}; "
              f"floor/its_hub {walls['floor'] / walls['its_hub']:.3f}, "
              f"replay/its_hub {walls['replay'] / walls['its_hub']:.3f}, "
              f"replay/refinery {walls['replay'] / walls['refinery']:.3f}")


def report_agreement(sides: list[Side]) -> None:
    """Each adaptive vote's agreement with the full vote of its own side."""
    for s in sides:
        full = next((f for f in sides if f.algorithm == "sc16" and f.name == s.name), None)
        if s.algorithm not in ("beta", "adaptive") or full is None or not s.answers:
            continue
        same = sum(bool(a and b and is_equivalent(a, b))
                   for a, b in zip(s.answers, full.answers, strict=True))
        print(f"{s.algorithm} {s.name}: its answer is its side's sc16 answer on {same} of "
              f"{len(s.answers)}; generated tokens {s.generated_tokens / full.generated_tokens:.2f}"
              f" of sc16's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2,
                    help="problems after the timed ones each side runs untimed first")
    ap.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS),
                    default=["sc", "bon", "beam", "particle"])
    a = ap.parse_args()
    if not ITS_HUB_PYTHON.exists():
        raise SystemExit(f"{ITS_HUB_PYTHON} is missing: run `make bench-peers` first")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # The warm-up passes run on problems after the timed ones.
    every = load_arith(limit=a.problems + a.warmup)
    problems, warmup = every[:a.problems], every[a.problems:]
    logdir = Path(tempfile.mkdtemp(prefix="vs-its-hub-"))
    print(f"logs in {logdir}", flush=True)
    upstream = vllm_server(logdir)
    refinery = Service("refinery", [sys.executable, "-m", "refinery.cli", "serve",
                                    "--port", str(PORTS["refinery"]), "--model", DEFAULT_MODEL,
                                    "--max-concurrent-requests", "256",
                                    "--backend", "vllm-server", "--base-url", url("vllm")],
                       dict(os.environ), logdir)
    try:
        upstream.wait_ready(url("vllm", "/health"))
        refinery.wait_ready(url("refinery", "/health"))
        sides = [s for r in range(a.rounds) for name in a.algorithms
                 for s in run_algorithm(name, r, problems, warmup, a)]
    finally:
        refinery.stop()
        upstream.stop()
    report(sides, a)
    report_agreement(sides)


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its servers
    main()
