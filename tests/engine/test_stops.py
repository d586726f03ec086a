"""Stop rules: DeepConf's confidence monitor, the loop detector through the same
interface, and how the backends (scripted double, OpenAI upstream) drive them."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from refinery.engine.backends.fan_out import checked_whole, may_check_after_end
from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig
from refinery.engine.confidence import ConfidenceRule, percentile, token_confidence
from refinery.engine.context import Context
from refinery.engine.errors import InvalidRequestError
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.stops import (
    AbortSwitch,
    AnyRule,
    Piece,
    Stop,
    WatchedSample,
    WatchedStream,
    caller_tokens,
    cut_at,
    wire_params,
)
from refinery.engine.types import Completion, Message, SamplingParams, TokenLogprob, TopLogprob
from tests.scripted_backend import ScriptedBackend
from tests.servers import ThreadedApp
from tests.waiting import wait_for

Q = [Message(role="user", content="q")]
SURE = [0.0, -10.0, -10.0, -10.0]  # confidence 7.5
UNSURE = [-1.0, -1.5, -1.5, -2.0]  # confidence 1.5
LOOP = ("First add 3 and 4 to get 7. " + "Then we add 3 and 4 again to check. " * 12)


def tok(*logprobs: float) -> TokenLogprob:
    return TokenLogprob(token="w", logprob=logprobs[0],
                        top_logprobs=[TopLogprob(token=f"t{i}", logprob=v)
                                      for i, v in enumerate(logprobs)])


def sure_then_unsure(sure: int):
    """``tops`` for the double: ``sure`` confident words, then unsure ones."""
    return lambda text, i: [SURE] * sure + [UNSURE] * len(text.split())


def test_token_confidence_is_minus_the_mean_of_the_top_k():
    assert token_confidence(tok(*SURE), 4) == 7.5
    assert token_confidence(tok(*SURE), 2) == 5.0  # only the k most likely count
    assert token_confidence(TokenLogprob(token="w", logprob=-0.25), 20) == 0.25
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([5.0], 90) == 5.0


def test_confidence_monitor_measures_groups_tail_and_bottom10():
    mon = ConfidenceRule(top_k=4, window=2, tail=3).start()
    assert mon.feed("a b", [tok(*SURE), tok(*SURE)]) is None
    assert mon.feed("c d", [tok(*UNSURE), tok(*SURE)]) is None  # no threshold: never stops
    m = mon.measures()
    # groups: (7.5+7.5)/2, (7.5+1.5)/2, (1.5+7.5)/2
    assert m["confidence"] == 4.5 and m["bottom10"] == 4.5
    assert m["tail"] == pytest.approx((1.5 + 7.5 + 7.5) / 3)
    assert m["mean"] == 6.0 and m["tokens"] == 4 and "stopped_at" not in m


def test_a_trace_shorter_than_the_window_is_one_group():
    mon = ConfidenceRule(top_k=4, window=10, threshold=100.0).start()
    assert mon.feed("a b", [tok(*SURE), tok(*UNSURE)]) is None  # no full window: no stop
    assert mon.measures()["confidence"] == 4.5


async def test_a_low_confidence_trace_is_stopped_at_the_token_that_tips_the_window():
    backend = ScriptedBackend([(".*", " ".join(f"w{j}" for j in range(40)))], watch=True,
                              tops=sure_then_unsure(10))
    ctx = Context(backend, params=SamplingParams(max_tokens=64))
    rule = ConfidenceRule(top_k=4, window=4, threshold=4.6)
    [c] = await ctx.generate(Q, stop_rule=rule)
    # Windows of 4 over 10 tokens at 7.5, then 1.5: 6.0 at the 11th token, then
    # (2 x 7.5 + 2 x 1.5) / 4 = 4.5 < 4.6 at the 12th: stopped there.
    assert c.finish_reason == "confidence"
    assert c.measures["stopped_at"] == 12 and c.completion_tokens == 12
    assert c.text == " ".join(f"w{j}" for j in range(12))  # kept whole, up to the stop
    assert c.measures["confidence"] == 4.5
    assert ctx.spent.completion_tokens == 12  # usage: every token before the stop
    assert c.token_logprobs is None  # fetched for the rule, not shown to the caller


async def test_a_confident_trace_runs_to_its_end_and_is_measured():
    backend = ScriptedBackend([(".*", "one two three four five six")], watch=True,
                              tops=lambda text, i: [SURE] * 6)
    [c] = await Context(backend).generate(
        Q, SamplingParams(logprobs=True, top_logprobs=1),
        stop_rule=ConfidenceRule(top_k=4, window=4, threshold=4.6))
    assert c.finish_reason == "stop" and c.completion_tokens == 6
    assert c.measures["confidence"] == 7.5 and "stopped_at" not in c.measures
    # The caller asked for 1 alternative; the rule's 4 stay inside the backend.
    assert all(len(t.top_logprobs) == 1 for t in c.token_logprobs)


def test_wire_params_ask_for_what_the_rule_needs_and_callers_get_what_they_asked():
    rule = ConfidenceRule(top_k=20)
    assert wire_params(SamplingParams(), None) == SamplingParams()
    wire = wire_params(SamplingParams(logprobs=True, top_logprobs=2), rule)
    assert wire.logprobs and wire.top_logprobs == 20
    assert wire_params(SamplingParams(), CusumLoopDetector()) == SamplingParams()
    tokens = [tok(*([-1.0] * 20))]
    assert caller_tokens(tokens, SamplingParams()) is None
    [t] = caller_tokens(tokens, SamplingParams(logprobs=True, top_logprobs=3))
    assert len(t.top_logprobs) == 3


def test_any_rule_of_keeps_a_lone_rule_and_joins_several():
    det, rule = CusumLoopDetector(), ConfidenceRule()
    assert AnyRule.of(None, None) is None and AnyRule.of(det, None) is det
    both = AnyRule.of(det, None, rule)
    assert both == AnyRule((det, rule)) and both.top_logprobs == 20


def test_only_rules_that_stop_a_whole_text_as_a_stream_are_checked_whole():
    loop = CusumLoopDetector()
    assert loop.stops_whole_as_streamed and AnyRule((loop, loop)).stops_whole_as_streamed
    assert not ConfidenceRule().stops_whole_as_streamed  # reads logprobs as they come
    assert not AnyRule((loop, ConfidenceRule())).stops_whole_as_streamed
    assert not AbortSwitch().stops_whole_as_streamed  # stops on when it fires


def test_a_call_is_checked_whole_only_when_short_chunk_free_and_not_n_greedy_samples():
    loop, short = CusumLoopDetector(), SamplingParams(max_tokens=128)
    assert may_check_after_end(loop, short, 5, 128) and may_check_after_end(loop, short, 1, 200)
    assert not may_check_after_end(loop, SamplingParams(max_tokens=129), 5, 128)
    assert not may_check_after_end(loop, short, 5, None)  # None: never
    assert not may_check_after_end(ConfidenceRule(), short, 5, 128)
    greedy = SamplingParams(max_tokens=64, temperature=0)
    assert may_check_after_end(loop, greedy, 1, 128)
    assert not may_check_after_end(loop, greedy, 2, 128)


def test_cut_at_clamps_and_keeps_the_prefix_of_the_piece():
    assert cut_at("abc", "defg", 5) == (5, "de")
    assert cut_at("abc", "defg", 2) == (2, "")
    assert cut_at("abc", "de", 99) == (5, "de")


def loop_cut_directly(text: str) -> int:
    return CusumLoopDetector().start().feed(text).keep


@pytest.mark.parametrize("with_confidence", [False, True])
async def test_the_loop_detector_cuts_as_before_through_the_interface(with_confidence):
    # Fed word by word through the driver, alone or beside a confidence rule that only
    # measures, the CUSUM monitor stops the sample where it alarms on the whole text.
    backend = ScriptedBackend([(".*", LOOP)], watch=True)
    ctx = Context(backend, loop_detector=CusumLoopDetector(), loop_policy="truncate",
                  params=SamplingParams(max_tokens=500))
    rule = ConfidenceRule(top_k=4, window=4) if with_confidence else None
    [c] = await ctx.generate(Q, stop_rule=rule)
    onset = loop_cut_directly(LOOP)
    assert c.finish_reason == "loop" and c.loop_onset == onset
    assert c.text == LOOP[:onset] and c.text.count("Then we") == 1
    assert c.completion_tokens < len(LOOP.split())
    assert (c.measures is not None) == with_confidence


def test_watched_sample_cuts_a_piece_at_the_onset():
    class CutAt5:
        top_logprobs = 0

        def start(self):
            class M:
                def feed(self, text, tokens):
                    return Stop("loop", keep=5) if "x" in text else None

                def measures(self):
                    return None
            return M()

    watch = WatchedSample(CutAt5())
    assert watch.add("abc") == "abc"
    assert watch.add("dexyz") == "de" and watch.text == "abcde" and watch.onset == 5
    assert watch.stop.reason == "loop"


# -- the fan-out on the scripted double: one request checked whole, or streams ------------


@pytest.mark.parametrize("limit,looped_tokens", [(128, 116), (None, 68)])
async def test_a_short_watched_call_is_checked_whole_or_streamed_with_the_same_cut(
        limit, looped_tokens):
    texts = [LOOP, "Add 3 and 4 to get 7."]
    backend = ScriptedBackend([(".*", texts)], watch=True, whole_check_max_tokens=limit)
    ctx = Context(backend, loop_detector=CusumLoopDetector(), loop_policy="truncate",
                  params=SamplingParams(max_tokens=128))
    looped, clean = await ctx.generate(Q, n=2)
    cut = loop_cut_directly(LOOP)
    assert LOOP[:cut] == "First add 3 and 4 to get 7. Then we add 3 and 4 again to check. "
    assert (looped.text, looped.finish_reason, looped.loop_onset) == (LOOP[:cut], "loop", cut)
    assert (clean.text, clean.finish_reason, clean.loop_onset) == (texts[1], "stop", None)
    # Checked whole, every word of the loop was generated (116 of them) and counts;
    # streamed, the sample ended at the 68th word, the one that tipped the alarm.
    assert (looped.completion_tokens, clean.completion_tokens) == (looped_tokens, 7)
    assert ctx.spent.completion_tokens == looped_tokens + 7
    assert [c.n for c in backend.calls] == [2]


def test_checked_whole_keeps_a_sample_no_rule_stops_as_it_is():
    comp = Completion(text="Add 3 and 4 to get 7.", prompt_tokens=3, completion_tokens=7,
                      finish_reason="length")
    assert checked_whole(comp, CusumLoopDetector()) == comp
    assert checked_whole(comp, None) is comp


async def test_a_call_of_no_samples_is_refused():
    with pytest.raises(InvalidRequestError, match="n must be >= 1") as err:
        await ScriptedBackend([(".*", "x")]).generate(Q, SamplingParams(), n=0)
    assert err.value.param == "n"


# -- an OpenAI-compatible upstream: the stream is closed at the stop ---------------------


def chunk(piece: str, top: list[float] | None) -> str:
    lp = None
    if top is not None:
        lp = {"content": [{"token": piece, "logprob": top[0], "bytes": None,
                           "top_logprobs": [{"token": f"t{i}", "logprob": v, "bytes": None}
                                            for i, v in enumerate(top)]}]}
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": piece}, "logprobs": lp,
                         "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n"


class StreamingUpstream(ThreadedApp):
    """Streams 200 tokens, 10 sure then unsure, one per chunk; records each request body
    and how many chunks went out before the client hung up."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.sent = 0
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            req = await request.json()
            self.bodies.append(req)

            async def body():
                for j in range(200):
                    top = (SURE if j < 10 else UNSURE)[: req.get("top_logprobs") or 1]
                    yield chunk(f" w{j}", top if req.get("logprobs") else None)
                    self.sent += 1
                    await asyncio.sleep(0.005)
                yield "data: [DONE]\n\n"

            return StreamingResponse(body(), media_type="text/event-stream")

        super().__init__(app)


async def test_an_upstream_stream_is_closed_at_a_confidence_stop():
    upstream = StreamingUpstream()
    with upstream as url:
        be = OpenAIBackend("m", url)
        rule = ConfidenceRule(top_k=4, window=4, threshold=4.6)
        [c] = await be.generate(Q, SamplingParams(max_tokens=300), stop_rule=rule)
        # The server notices the hang-up and stops sending: the count stops moving.
        sent = [-1]

        def settled() -> bool:
            settled_now, sent[0] = sent[0] == upstream.sent, upstream.sent
            return settled_now

        assert await wait_for(settled, seconds=10)
        await be.aclose()
    [req] = upstream.bodies
    assert req["logprobs"] is True and req["top_logprobs"] == 4  # asked for the rule
    assert c.finish_reason == "confidence" and c.measures["stopped_at"] == 12
    assert c.completion_tokens == 12 and c.text == "".join(f" w{j}" for j in range(12))
    assert c.token_logprobs is None and c.logprob is None
    assert upstream.sent < 100  # aborted, not drained


# -- short calls under the loop detector: one request, each sample checked whole -----------


class BothWaysUpstream(ThreadedApp):
    """Answers ``texts[i]`` as choice i of a whole response, or, streamed, the k-th
    stream word by word with ``texts[k % len(texts)]``; records each request body."""

    def __init__(self, texts: list[str]) -> None:
        self.bodies: list[dict] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            req = await request.json()
            self.bodies.append(req)
            if not req.get("stream"):
                return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                        "choices": [{"index": i, "finish_reason": "length",
                                     "message": {"role": "assistant", "content": t}}
                                    for i, t in enumerate(texts[:req["n"]])],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 100,
                                  "total_tokens": 103}}
            text = texts[(sum(1 for b in self.bodies if b.get("stream")) - 1) % len(texts)]

            async def body():
                for word in text.split(" "):
                    yield chunk(word + " ", None)
                yield "data: [DONE]\n\n"

            return StreamingResponse(body(), media_type="text/event-stream")

        super().__init__(app)


async def test_a_short_call_under_the_loop_detector_is_one_request_checked_whole():
    texts = [LOOP, "Add 3 and 4 to get 7."]
    upstream = BothWaysUpstream(texts)
    with upstream as url:
        whole = await OpenAIBackend("m", url).generate(
            Q, SamplingParams(max_tokens=128), n=2, stop_rule=CusumLoopDetector())
        bodies, upstream.bodies = upstream.bodies, []
        streamed = await OpenAIBackend("m", url,
                                       config=OpenAIConfig(whole_check_max_tokens=None)).generate(
            Q, SamplingParams(max_tokens=128), n=2, stop_rule=CusumLoopDetector())
    [req] = bodies  # one request for both samples, not streamed
    assert req["n"] == 2 and not req.get("stream")
    assert [b.get("stream") for b in upstream.bodies] == [True, True]
    cut = loop_cut_directly(LOOP)
    assert 0 < cut < len(LOOP)
    looped, clean = whole
    assert (looped.text, looped.finish_reason, looped.loop_onset) == (LOOP[:cut], "loop", cut)
    assert (clean.text, clean.finish_reason, clean.loop_onset) == (texts[1], "length", None)
    # The tokens past the stop were spent; with no per-choice count upstream, the
    # 100 are shared by text length (neither 128-token "length" finish can be true).
    share = round(100 * (len(LOOP) + 1) / (len(LOOP) + len(texts[1]) + 2))
    assert (looped.completion_tokens, clean.completion_tokens) == (share, 100 - share)
    # The same two samples streamed word by word (in either order): the loop is cut
    # at the same place, the clean one is not.
    assert sorted((c.finish_reason, c.text.rstrip()) for c in streamed) == \
        [("abort", texts[1]), ("loop", LOOP[:cut].rstrip())]


async def test_a_long_call_under_the_loop_detector_streams_every_sample():
    upstream = BothWaysUpstream([LOOP])
    with upstream as url:
        be = OpenAIBackend("m", url, config=OpenAIConfig(whole_check_max_tokens=256))
        comps = await be.generate(Q, SamplingParams(max_tokens=257), n=2,
                                  stop_rule=CusumLoopDetector())
    assert [b.get("stream") for b in upstream.bodies] == [True, True]
    assert [c.finish_reason for c in comps] == ["loop", "loop"]


async def test_greedy_samples_under_the_loop_detector_are_streamed_apart():
    upstream = BothWaysUpstream([LOOP])
    with upstream as url:
        be = OpenAIBackend("m", url)
        await be.generate(Q, SamplingParams(max_tokens=64, temperature=0), n=2,
                          stop_rule=CusumLoopDetector())
        assert [b.get("stream") for b in upstream.bodies] == [True, True]
        upstream.bodies = []
        await be.generate(Q, SamplingParams(max_tokens=64, temperature=0),
                          stop_rule=CusumLoopDetector())
    [one] = upstream.bodies  # one greedy sample: one request, checked whole
    assert one["n"] == 1 and not one.get("stream")


async def test_watched_stream_stops_and_closes_the_pieces():
    closed = []

    async def pieces():
        try:
            for word in ["one", " two", " three", " four"]:
                yield Piece(word, None, 1, None)
        finally:
            closed.append(True)

    class StopAtThree:
        top_logprobs = 0

        def start(self):
            class Monitor:
                def feed(self, text, tokens):
                    return Stop("loop") if "three" in text else None

                def measures(self):
                    return None
            return Monitor()

    stream = WatchedStream(StopAtThree(), SamplingParams())
    texts = [d.text async for d in stream.deltas(pieces())]
    assert texts == ["one", " two", " three"]
    assert (stream.finish, stream.n_tokens, stream.watch.text) == ("loop", 3, "one two three")
    assert closed == [True]  # closing the pieces is how the engine learns to abort
