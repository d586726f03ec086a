"""Self-consistency through OptiLLM and through refinery, side by side in one run.

The same work on three sides and a reference, one after another, on one machine, in
``--rounds`` rounds; odd rounds run the sides in the mirrored order (A B C, then C B
A), since the machine's speed drifts while it runs (a shared host), and the ratios
are of the mean walls. Each side first answers ``--warmup`` other questions untimed,
and the vLLM server's prefix cache is emptied before each timed pass:

1. **optillm**: OptiLLM's proxy (its own virtualenv, ``make bench-peers``) in front
   of vLLM's own OpenAI server, model ``self_consistency-<model>``;
2. **upstream**: ``refinery serve --backend openai`` in front of the same vLLM
   server, model ``sc(cot, n=5)@<model>``;
3. **in-process**: ``refinery serve`` on its own engine (the vLLM server stopped
   first; same dtype and engine settings), model ``sc(cot, n=5)@<model>``;
4. **vllm-n5**, a reference, not a competitor: the clients ask the vLLM server
   itself for ``n=5`` samples of each question (no proxy, no vote): the engine
   doing OptiLLM's sampling with nothing in front.
5. **vllm-cot**, the other reference: the vLLM server asked for ``n=5`` samples of
   the request refinery's ``sc(cot, n=5)`` (or ``--spec``) makes of each question
   (cot's step-by-step instruction appended, sc's temperature 0.7). Refinery's walls
   against it show what refinery's own layer costs; vllm-cot against vllm-n5 shows
   what that request costs over the bare question.

Work: the first ``--questions`` GSM8K test questions sent by ``--clients``
concurrent official ``openai`` async clients, ``max_tokens`` 128. Per side it prints
the wall seconds, the tokens generated (the vLLM server's
``vllm:generation_tokens_total``; in-process, refinery's own count of its engine's
tokens, ``refinery_tokens_total{kind="completion"}``), the completion tokens the
clients were told in ``usage``, the answers returned, how many were right (GSM8K
gold, refinery's math verifier), and the ratios of refinery's wall times to
OptiLLM's. While a side on the vLLM
server runs, its sequences in flight are sampled every 2 s, to show where the time
goes.

    make bench-peers   # once: OptiLLM into $REFINERY_HOME/peers/optillm
    python bench/vs_optillm.py [--questions 32] [--clients 16] [--rounds 2] [--warmup 4]
                               [--sides optillm vllm-n5 vllm-cot upstream in-process]
                               [--spec "sc(cot, n=5)"]

``--spec 'sc(cot(instruction=""), n=5)'`` runs refinery on the bare question, as
OptiLLM's samples ask it (at sc's temperature 0.7; OptiLLM's and vllm-n5's are at 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Sets the same vLLM environment (KV cache, cores) as the strategy bench; no vllm import.
from strategy_throughput import DATA, VLLMConfig, engine_kwargs  # noqa: E402

from refinery.engine.models import DEFAULT_MODEL, refinery_home  # noqa: E402
from refinery.engine.types import Message, Task  # noqa: E402
from refinery.strategies.cot import CoT  # noqa: E402
from refinery.strategies.registry import build  # noqa: E402
from refinery.strategies.self_consistency import SelfConsistency  # noqa: E402

SIDES = ("optillm", "vllm-n5", "vllm-cot", "upstream", "in-process")
SAMPLES = 5  # OptiLLM's self_consistency samples and the n of SPEC
SPEC = "sc(cot, n=5)"
PORTS = {"vllm": 8701, "optillm": 8702, "refinery": 8703}
GEN_TOKENS = re.compile(r"^vllm:generation_tokens_total\{[^}]*\}\s+([0-9.e+]+)", re.M)
RUNNING = re.compile(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\}\s+([0-9.e+]+)", re.M)
# Seconds between scrapes of the vLLM server's /metrics while a side on it runs. The
# scrapes cost that server's process CPU the in-process side (no scrapes) does not
# pay: every 0.5 s, vllm-cot passes took 1.04x as long as without (A B B A x2).
SAMPLE_EVERY = 2.0
# What the reference sides separate: the engine's share of OptiLLM's time, the cost
# of refinery's request over the bare question, and refinery's own layer.
REFERENCE_RATIOS = (
    ("vllm-n5", "optillm", "the engine's own server doing OptiLLM's sampling, no proxy"),
    ("vllm-cot", "optillm", "the engine's own server doing refinery's sampling, no proxy"),
    ("vllm-cot", "vllm-n5", "refinery's cot request over the bare question, same engine"),
    ("in-process", "vllm-cot", "refinery's layer, in-process, over the same work"),
    ("upstream", "vllm-cot", "refinery's layer, through the upstream, over the same work"),
)
REFINERY_TOKENS = re.compile(
    r'^refinery_tokens_total\{[^}]*kind="completion"[^}]*\}\s+([0-9.e+]+)', re.M)


@dataclass
class Side:
    """What one side did with the same work."""

    name: str
    wall_seconds: float = 0.0
    generated_tokens: float = 0.0
    usage_completion_tokens: int = 0
    usage_missing: int = 0  # responses whose usage said nothing
    answers: int = 0
    correct: int = 0
    errors: list[str] = field(default_factory=list)
    in_flight_mean: float | None = None


# ------------------------------------------------------------------ processes


class Service:
    """A server in its own process group, its output in a log file; stopped as a group."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], logdir: Path):
        self.name, self.log = name, logdir / f"{name}.log"
        # cwd: OptiLLM loads plugins from ./optillm/plugins of wherever it starts.
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log.open("w"), cwd=logdir,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, url: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"{self.name} not ready after {timeout} s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def vllm_server(logdir: Path) -> Service:
    """vLLM's own OpenAI server with refinery's engine settings and dtype."""
    kw = engine_kwargs(DEFAULT_MODEL, VLLMConfig.max_num_batched_tokens)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kw["model"],
           "--served-model-name", DEFAULT_MODEL, "--host", "127.0.0.1",
           "--port", str(PORTS["vllm"]), "--dtype", kw["dtype"],
           "--max-model-len", str(kw["max_model_len"]),
           "--max-num-seqs", str(kw["max_num_seqs"]),
           "--max-num-batched-tokens", str(kw["max_num_batched_tokens"]),
           "--gpu-memory-utilization", str(kw["gpu_memory_utilization"])]
    cmd += ["--enforce-eager"] if kw["enforce_eager"] else []
    cmd += ["--enable-prefix-caching"] if kw["enable_prefix_caching"] else []
    cmd += ["--block-size", str(kw["block_size"])] if kw.get("block_size") else []
    # Dev mode serves POST /reset_prefix_cache, so no side meets another's cached prompts.
    return Service("vllm", cmd, dict(os.environ, VLLM_SERVER_DEV_MODE="1"), logdir)


def refinery_server(logdir: Path, upstream: str | None) -> Service:
    cmd = [sys.executable, "-m", "refinery.cli", "serve", "--port", str(PORTS["refinery"]),
           "--model", DEFAULT_MODEL, "--max-concurrent-requests", "256"]
    if upstream:
        cmd += ["--backend", "openai", "--base-url", upstream]
    return Service("refinery-" + ("upstream" if upstream else "in-process"), cmd,
                   dict(os.environ), logdir)


def optillm_server(logdir: Path, upstream: str) -> Service | None:
    exe = refinery_home() / "peers" / "optillm" / "bin" / "optillm"
    if not exe.exists():
        return None
    # OPENAI_API_KEY makes OptiLLM an OpenAI client of --base-url; OPTILLM_API_KEY
    # would switch it to local Hugging Face inference instead.
    env = {k: v for k, v in os.environ.items() if k != "OPTILLM_API_KEY"}
    env["OPENAI_API_KEY"] = "sk-bench"
    cmd = [str(exe), "--base-url", upstream, "--port", str(PORTS["optillm"]),
           "--host", "127.0.0.1"]
    return Service("optillm", cmd, env, logdir)


@dataclass(frozen=True)
class Ask:
    """What a side's clients send for each question: the model they name, their
    ``n``, the cot strategy whose messages they send (None: the bare question), and
    the temperature (None: the server's default)."""

    model: str
    n: int = 1
    cot: CoT | None = None
    temperature: float | None = None

    def request(self, question: str) -> dict:
        msgs = [Message(role="user", content=question)]
        if self.cot is not None:
            msgs = self.cot.messages(Task(messages=msgs))
        extra = {} if self.temperature is None else {"temperature": self.temperature}
        return {"model": self.model, "n": self.n,
                "messages": [m.model_dump(include={"role", "content"}) for m in msgs], **extra}


# ------------------------------------------------------------------ the work


def load_work(n: int) -> list[tuple[str, str]]:
    from refinery.eval.datasets import gsm8k_gold

    with DATA.open() as f:
        rows = [json.loads(line) for _, line in zip(range(n), f, strict=False)]
    return [(r["question"], gsm8k_gold(r["answer"])) for r in rows]


async def run_clients(base_url: str, ask: Ask, work: list[tuple[str, str]], clients: int,
                      max_tokens: int, side: Side) -> None:
    """``clients`` concurrent openai clients over ``work``; fills ``side``."""
    from openai import AsyncOpenAI

    from refinery.verifiers.math import extract_answer, is_equivalent

    queue: asyncio.Queue = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)

    async def client() -> None:
        api = AsyncOpenAI(base_url=base_url, api_key="sk-bench", timeout=3600, max_retries=0)
        while not queue.empty():
            question, gold = queue.get_nowait()
            try:
                r = await api.chat.completions.create(max_tokens=max_tokens,
                                                      **ask.request(question))
            except Exception as exc:  # a side's failure is a figure, not a crash
                side.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            text = r.choices[0].message.content or ""
            side.answers += bool(text.strip())
            side.correct += is_equivalent(extract_answer(text), gold)
            if r.usage is None or not r.usage.completion_tokens:
                side.usage_missing += 1
            else:
                side.usage_completion_tokens += r.usage.completion_tokens
        await api.close()

    await asyncio.gather(*(client() for _ in range(clients)))


def scrape(url: str, pattern: re.Pattern[str]) -> float:
    return sum(float(x) for x in pattern.findall(httpx.get(url, timeout=10).text))


async def sample_in_flight(metrics_url: str, samples: list[float]) -> None:
    while True:
        try:
            samples.append(await asyncio.to_thread(scrape, metrics_url, RUNNING))
        except httpx.HTTPError:
            pass
        await asyncio.sleep(SAMPLE_EVERY)


async def measure(name: str, base_url: str, ask: Ask, tokens_url: str,
                  tokens_re: re.Pattern[str], a: argparse.Namespace, work: Work) -> Side:
    """One side's timed pass over ``work.timed``, after an untimed pass over ``work.warmup``."""
    if work.warmup:  # first-use costs (kernels, imports, connections) land on no side
        await run_clients(base_url, ask, work.warmup, a.clients, a.max_tokens, Side(name))
    if tokens_re is GEN_TOKENS:  # the same prompts must not find another side's cache
        async with httpx.AsyncClient(timeout=30) as http:
            (await http.post(url("vllm", "/reset_prefix_cache"))).raise_for_status()
    side = Side(name)
    before = scrape(tokens_url, tokens_re)
    samples: list[float] = []
    sampler = (asyncio.create_task(sample_in_flight(tokens_url, samples))
               if tokens_re is GEN_TOKENS else None)
    t0 = time.perf_counter()
    await run_clients(base_url, ask, work.timed, a.clients, a.max_tokens, side)
    side.wall_seconds = time.perf_counter() - t0
    if sampler:
        sampler.cancel()
        side.in_flight_mean = statistics.mean(samples) if samples else None
    side.generated_tokens = scrape(tokens_url, tokens_re) - before
    return side


# ------------------------------------------------------------------ sides


@dataclass
class Work:
    """The timed questions, and the others each side warms up on first."""

    timed: list[tuple[str, str]]
    warmup: list[tuple[str, str]]


def url(name: str, path: str = "/v1") -> str:
    return f"http://127.0.0.1:{PORTS[name]}{path}"


def spec_request(spec: str) -> Ask:
    """The request ``spec`` (self-consistency over a cot) makes of vLLM per question:
    its messages, ``n`` and temperature (not the logprobs a log-prob tie-break asks)."""
    sc = build(spec)
    if not (isinstance(sc, SelfConsistency) and isinstance(sc.inner[0], CoT)):
        raise SystemExit(f"--spec {spec!r}: the vllm-cot side needs sc over a cot")
    return Ask(DEFAULT_MODEL, sc.params.n, sc.inner[0], sc.params.temperature)


def upstream_side(name: str, spec: str, logdir: Path) -> tuple[Service | None, str, Ask]:
    """What a side on the vLLM server runs: its proxy (None: the clients ask vLLM
    itself), the proxy's port, and what the clients send."""
    if name == "vllm-n5":
        return None, "vllm", Ask(DEFAULT_MODEL, SAMPLES)
    if name == "vllm-cot":
        return None, "vllm", spec_request(spec)
    if name == "optillm":
        return (optillm_server(logdir, url("vllm")), "optillm",
                Ask(f"self_consistency-{DEFAULT_MODEL}"))
    return refinery_server(logdir, url("vllm")), "refinery", Ask(f"{spec}@{DEFAULT_MODEL}")


def run_upstream_sides(names: list[str], a: argparse.Namespace, work: Work,
                       logdir: Path) -> list[Side]:
    """The sides in ``names`` but in-process, in this order, on one vLLM server."""
    sides: list[Side] = []
    upstream = vllm_server(logdir)
    try:
        upstream.wait_ready(url("vllm", "/health"))
        metrics = url("vllm", "/metrics")
        for name in names:
            proxy, port, ask = upstream_side(name, a.spec, logdir)
            if proxy is None and name == "optillm":
                print("optillm: skipped, not installed (run `make bench-peers`)", flush=True)
                continue
            try:
                if proxy is not None:
                    proxy.wait_ready(url(port, "/health"))
                sides.append(asyncio.run(measure(name, url(port), ask, metrics, GEN_TOKENS,
                                                 a, work)))
            finally:
                if proxy is not None:
                    proxy.stop()
            print(json.dumps(asdict(sides[-1])), flush=True)
    finally:
        upstream.stop()
    return sides


def run_in_process_side(a: argparse.Namespace, work: Work, logdir: Path) -> Side:
    server = refinery_server(logdir, None)
    try:
        server.wait_ready(url("refinery", "/health"))
        side = asyncio.run(measure("in-process", url("refinery"), Ask(f"{a.spec}@{DEFAULT_MODEL}"),
                                   url("refinery", "/metrics"), REFINERY_TOKENS, a, work))
    finally:
        server.stop()
    print(json.dumps(asdict(side)), flush=True)
    return side


def run_round(rnd: int, a: argparse.Namespace, work: Work, logdir: Path) -> list[Side]:
    """Every side once; odd rounds run them in the mirrored order (A B C, C B A), so a
    machine that speeds up or slows down during the run favours no side."""
    order = [s for s in SIDES if s in a.sides]
    if rnd % 2:
        order.reverse()
    on_upstream = [s for s in order if s != "in-process"]
    in_process_first = order[:1] == ["in-process"]
    sides: list[Side] = []
    if in_process_first:
        sides.append(run_in_process_side(a, work, logdir))
    if on_upstream:
        sides += run_upstream_sides(on_upstream, a, work, logdir)
    if "in-process" in order and not in_process_first:
        sides.append(run_in_process_side(a, work, logdir))
    return sides


def report(rounds: list[list[Side]], a: argparse.Namespace) -> None:
    print(f"\n{a.questions} GSM8K questions, {a.clients} clients, max_tokens {a.max_tokens}, "
          f"refinery {a.spec}, {len(rounds)} round(s), each side warmed up on {a.warmup} "
          "other questions first")
    print(f"{'round':<5} {'side':<11} {'wall s':>8} {'generated':>10} {'usage':>8} "
          f"{'answers':>8} {'right':>6} {'in flight':>9} errors")
    for rnd, sides in enumerate(rounds):
        for s in sides:
            usage = f"{s.usage_completion_tokens}" + (f" ({s.usage_missing} empty)"
                                                      if s.usage_missing else "")
            fl = f"{s.in_flight_mean:.1f}" if s.in_flight_mean is not None else "-"
            print(f"{rnd:<5} {s.name:<11} {s.wall_seconds:>8.1f} {s.generated_tokens:>10.0f} "
                  f"{usage:>8} {s.answers:>8} {s.correct:>6} {fl:>9} {len(s.errors)}")
    walls: dict[str, list[float]] = {}
    for s in (s for sides in rounds for s in sides):
        walls.setdefault(s.name, []).append(s.wall_seconds)
    base = statistics.mean(walls["optillm"]) if "optillm" in walls else None
    for name in ("in-process", "upstream"):
        if name in walls and base is not None:
            per_round = [w / o for w, o in zip(walls[name], walls["optillm"], strict=False)]
            print(f"wall {name}/optillm {statistics.mean(walls[name]) / base:.3f} "
                  f"(means of {len(walls[name])}; by round "
                  f"{' '.join(f'{r:.3f}' for r in per_round)})")
    mean = {name: statistics.mean(w) for name, w in walls.items()}
    for num, den, what in REFERENCE_RATIOS:
        if num in mean and den in mean:
            print(f"wall {num}/{den} {mean[num] / mean[den]:.3f} ({what})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=4,
                    help="questions after the timed ones, sent untimed before each side")
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    ap.add_argument("--spec", default=SPEC,
                    help="refinery's strategy; the vllm-cot side asks what it asks")
    a = ap.parse_args()
    if "vllm-cot" in a.sides:
        spec_request(a.spec)  # refuse a spec it cannot mirror before any side runs
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    rows = load_work(a.questions + a.warmup)
    work = Work(timed=rows[:a.questions], warmup=rows[a.questions:])
    logdir = Path(tempfile.mkdtemp(prefix="vs-optillm-"))
    print(f"logs in {logdir}", flush=True)
    report([run_round(r, a, work, logdir) for r in range(a.rounds)], a)


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
