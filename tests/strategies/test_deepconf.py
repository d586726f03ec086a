"""DeepConf: the threshold from the warm-up, early stops, the weighted vote, consensus."""

from __future__ import annotations

import pytest

from refinery.engine.errors import SpecError
from refinery.strategies import build_with_graph
from refinery.strategies.cot import CoT
from refinery.strategies.deepconf import DeepConf
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task

WINDOW = 4


def level(c: float) -> list[float]:
    """Top-4 log-probabilities whose token confidence (minus their mean) is ``c``."""
    return [0.0, *[-4 * c / 3] * 3]


class Traces:
    """Scripted traces in call order: trace j answers ``answer`` with one word per
    confidence in ``confs``. Its first word names it (``ta``, ``tb``...: no digit to
    read as an answer); the boxed answer is its last word, or its second with
    ``early=True``."""

    def __init__(self, *specs: tuple) -> None:
        self.specs = list(specs)
        self.drawn = 0

    def reply(self, messages, params, i) -> str:
        j, self.drawn = self.drawn, self.drawn + 1
        answer, confs, *early = self.specs[j]
        words = [f"t{chr(97 + j)}", *["ww"] * (len(confs) - 2)]
        boxed = f"\\boxed{{{answer}}}" if answer else "ww"
        return " ".join([words[0], boxed, *words[1:]] if early else [*words, boxed])

    def tops(self, text: str, i: int) -> list[list[float]]:
        return [level(c) for c in self.specs[ord(text.split()[0][1]) - 97][1]]

    def backend(self) -> ScriptedBackend:
        return ScriptedBackend([(r".*", self.reply)], watch=True, tops=self.tops)


def steady(answer: str, c: float, words: int = 12) -> tuple[str, list[float]]:
    return answer, [c] * words


def deepconf(**params) -> DeepConf:
    return DeepConf(CoT(), top_k=4, window=WINDOW, **params)


async def test_the_threshold_comes_from_the_warmup_and_stops_a_later_trace_in_time():
    traces = Traces(steady("18", 6.0), steady("20", 7.0), steady("18", 8.0),
                    ("18", [9.0] * 5 + [1.0] * 20), steady("18", 9.0))
    backend = traces.backend()
    run = ctx(backend)
    attempt = await deepconf(n=5, warmup=3, eta=50.0, batch=1, consensus=0.99).solve(
        task(), run)
    assert attempt.metadata["threshold"] == 7.0  # median of the warm-up's 6, 7, 8
    [warm] = [e for e in run.trace.events if e.kind == "generation"][:1]
    assert len(warm.completions) == 3 and backend.calls[0].n == 3  # one warm-up call
    assert all(c.finish_reason == "stop" for c in warm.completions)
    stopped = [c for e in run.trace.events if e.kind == "generation"
               for c in e.completions if c.finish_reason == "confidence"]
    # Windows of 4: 9 9 9 9 | then (9 + 9 + 9 + 1) / 4 = 7.0 (not below), then
    # (9 + 9 + 1 + 1) / 4 = 5.0 < 7.0 at the 7th token: stopped there.
    [c] = stopped
    assert c.measures["stopped_at"] == 7 and c.completion_tokens == 7
    assert run.spent.completion_tokens == 3 * 12 + 7 + 12  # every token before the stop
    assert [call.n for call in backend.calls] == [3, 1, 1]
    # Voters: the warm-up's three (6, 7, 8) and the later trace not stopped (9).
    assert attempt.answer == "18" and attempt.metadata["votes"] == {"18": 23.0, "20": 7.0}
    assert attempt.metadata["stopped_traces"] == 1 and attempt.metadata["ended"] == "n"
    assert attempt.text.startswith("te")  # the most confident voter of the answer


async def test_the_vote_is_weighted_by_confidence_not_counted():
    traces = Traces(steady("5", 4.0), steady("5", 4.0), steady("6", 9.0))
    attempt = await deepconf(n=3, mode="offline", eta=100.0).solve(task(), ctx(
        traces.backend()))
    assert attempt.answer == "6"  # one confident trace outweighs two unsure ones
    assert attempt.metadata["votes"] == {"5": 8.0, "6": 9.0}
    assert attempt.score == pytest.approx(9 / 17)


async def test_a_later_trace_below_the_threshold_does_not_vote_even_unstopped():
    # Shorter than a window, it is never stopped, but judged whole (5.0 < 7.0) at the end.
    traces = Traces(steady("1", 7.0), steady("2", 7.0), steady("1", 7.0),
                    steady("2", 5.0, words=3), steady("2", 8.0))
    run = ctx(traces.backend())
    attempt = await deepconf(n=5, warmup=3, eta=50.0, batch=1).solve(task(), run)
    records = [e for e in run.trace.events if e.step == "select"][0].data["records"]
    assert [r["weight"] for r in records] == [7.0, 7.0, 7.0, 0.0, 8.0]
    assert records[3] == {"answer": "2", "confidence": 5.0, "stopped_at": None, "weight": 0.0}
    assert attempt.metadata["votes"] == {"1": 14.0, "2": 15.0} and attempt.answer == "2"


async def test_offline_keeps_the_top_eta_percent():
    traces = Traces(steady("1", 5.0), steady("2", 6.0), steady("3", 7.0), steady("3", 8.0))
    run = ctx(traces.backend())
    attempt = await deepconf(n=4, mode="offline", eta=50.0).solve(task(), run)
    assert attempt.metadata["votes"] == {"3": 15.0}  # 7 and 8 are the top half
    [select] = [e for e in run.trace.events if e.step == "select"]
    weights = [t["weight"] for t in select.data["records"]]
    assert weights == [0.0, 0.0, 7.0, 8.0]
    assert [t["confidence"] for t in select.data["records"]] == [5.0, 6.0, 7.0, 8.0]


async def test_consensus_stops_sampling_after_the_warmup():
    traces = Traces(*[steady("18", 7.0 + j) for j in range(8)])
    backend = traces.backend()
    attempt = await deepconf(n=8, warmup=3, eta=90.0).solve(task(), ctx(backend))
    assert [call.n for call in backend.calls] == [3]  # no trace after the warm-up
    assert attempt.metadata["ended"] == "consensus" and attempt.score == 1.0


async def test_without_consensus_it_samples_up_to_n_in_batches():
    answers = ["1", "2", "3", "1", "2", "3", "1", "2"]
    traces = Traces(*[steady(a, 7.0) for a in answers])
    backend = traces.backend()
    run = ctx(backend)
    attempt = await deepconf(n=8, warmup=3, batch=2, eta=90.0).solve(task(), run)
    assert [call.n for call in backend.calls] == [3, 2, 2, 1]
    assert attempt.metadata["ended"] == "n" and attempt.metadata["traces"] == 8
    votes = [e for e in run.trace.events if e.step == "vote"]
    assert len(votes) == 3 and votes[-1].data["share"] == pytest.approx(3 / 8)
    assert attempt.answer in {"1", "2"}  # 3 each; 3 has 2


async def test_without_logprobs_it_is_a_plain_majority():
    backend = ScriptedBackend([(r".*", ["\\boxed{4}", "\\boxed{5}", "\\boxed{4}"])])
    attempt = await deepconf(n=3, mode="offline").solve(task(), ctx(backend))
    assert attempt.metadata["threshold"] is None
    assert attempt.answer == "4" and attempt.metadata["votes"] == {"4": 2.0, "5": 1.0}


def test_spec_worst_case_and_inner_check():
    _, g = build_with_graph("deepconf(n=8, warmup=3, batch=2)")
    assert g.nodes["n0"]["calls"] == 1 + 3
    assert build_with_graph("deepconf(mode='offline')")[1].nodes["n0"]["calls"] == 1
    assert build_with_graph("deepconf(re2)")[0].inner[0].name == "re2"
    with pytest.raises(SpecError, match="cot variant"):
        build_with_graph("deepconf(ssr)")
    with pytest.raises(SpecError, match="eta"):
        build_with_graph("deepconf(eta=0)")
