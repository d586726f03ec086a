"""Step-search traces -> TRL stepwise-supervision rows: data to train a process reward model.

A step search (``beam``, ``dvts``, ``particle``) grows a tree of partial solutions
and its trace holds all of it: every generation event's partial assistant turn
(what it continued) and its completions (the next steps), and every level's
``search`` event with the scorer's score of each path's last step. This module
reads the tree back. A path is *finished* when its last step states an answer,
comes back empty or is cut, the rule the search itself stops by
(:func:`~refinery.strategies.step_search.ends_solution`); its answer is checked
against the gold answer of the run's ``results.jsonl``.

Labels follow Math-Shepherd's hard estimate (Wang et al. 2024), computed over the
search's own tree instead of extra rollouts: a step is right when some finished
path that shares every step up to it reaches the gold answer. So a right path is
right at every step, and a wrong one is right up to where it left the last path
that still got there. One row per distinct finished path; problems without gold
give none (the labels need it).

Example:
    >>> stats = build_stepwise(["runs/beam-arith"], "out/prm.jsonl")  # doctest: +SKIP
    >>> stats.rows, stats.right_steps, stats.wrong_steps  # doctest: +SKIP
    (412, 1093, 688)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from refinery.distill.candidates import gold_of, question_of, read_results, run_files
from refinery.distill.schema import DistillError, StepwiseRow, scaffold_leak, write_rows
from refinery.engine.trace import Trace, read_traces
from refinery.strategies.step_search import ends_solution
from refinery.verifiers.math import extract_answer, is_equivalent
from refinery.verifiers.steps import split_steps

__all__ = ["FinishedPath", "StepwiseStats", "build_stepwise", "finished_paths",
           "stepwise_rows"]


@dataclass(frozen=True)
class FinishedPath:
    """A path of the search tree that ended, with each step's score (None: unscored)."""

    steps: tuple[str, ...]
    scores: tuple[float | None, ...]
    answer: str | None


@dataclass
class StepwiseStats:
    """What a build read and wrote."""

    traces: int = 0
    searched: int = 0  # traces of a step search
    without_gold: int = 0
    rows: int = 0
    right_steps: int = 0
    wrong_steps: int = 0


def _step_scores(trace: Trace) -> dict[tuple[str, int], float]:
    """(generation event, completion index) -> the score of the step it wrote."""
    scores: dict[tuple[str, int], float] = {}
    for e in trace.events:
        for event_id, index, score in e.data.get("last_steps", []) if e.step == "search" else []:
            if event_id is not None and score is not None:
                scores[(event_id, index)] = score
    return scores


def finished_paths(trace: Trace) -> list[FinishedPath]:
    """Every distinct finished path of a step search's trace (none for other traces)."""
    searches = {e.strategy for e in trace.events if e.kind == "step" and e.step == "search"}
    last_scores, by_prefix = _step_scores(trace), {}
    found: dict[tuple[str, ...], str | None] = {}
    for e in trace.events:
        if e.kind != "generation" or e.strategy not in searches or not e.messages:
            continue
        turn = e.messages[-1]  # a continued turn holds the path so far, read uncapped
        continued = turn.role == "assistant"
        prefix = tuple(split_steps(turn.content, max_steps=None)) if continued else ()
        for i, comp in enumerate(e.completions or []):
            written = split_steps(comp.text, max_steps=None)
            steps = prefix + tuple(written)
            if (e.id, i) in last_scores and written:
                by_prefix[steps] = last_scores[(e.id, i)]
            last = comp.text.strip("\n")
            if steps and ends_solution(last, comp.finish_reason):
                found.setdefault(steps, extract_answer(steps[-1]))
    return [FinishedPath(steps, tuple(by_prefix.get(steps[: j + 1]) for j in range(len(steps))),
                         answer) for steps, answer in found.items()]


def stepwise_rows(trace: Trace, gold: str, prompt: str, run: str,
                  dataset: str | None = None) -> Iterator[StepwiseRow]:
    """The trace's finished paths as rows, labelled by the outcomes under each step."""
    paths = finished_paths(trace)
    right = [p for p in paths if p.answer is not None and is_equivalent(p.answer, gold)]
    good = {p.steps[: j + 1] for p in right for j in range(len(p.steps))}
    for p in paths:
        if any(scaffold_leak(s) for s in p.steps):
            continue  # a step a PRM must not learn to read as a step
        yield StepwiseRow(prompt=prompt, completions=list(p.steps),
                          labels=[p.steps[: j + 1] in good for j in range(len(p.steps))],
                          metadata={"source_run": run, "problem_id": trace.task_id,
                                    "dataset": dataset,
                                    "strategy": trace.strategy, "model": trace.model,
                                    "answer": p.answer, "correct": p in right,
                                    "scores": list(p.scores)})


def build_stepwise(runs: Sequence[str | Path], out: str | Path) -> StepwiseStats:
    """Read step-search eval runs, write their stepwise rows to ``out`` (JSONL, atomic).

    Raises:
        DistillError: a run that does not exist, or no run held a step search's trace.
    """
    stats, rows = StepwiseStats(), []
    for run in runs:
        traces_p, results_p, _ = run_files(Path(run))
        results = read_results(results_p) if results_p else {}
        for trace in read_traces(traces_p) if traces_p else []:
            stats.traces += 1
            if not any(e.step == "search" for e in trace.events):
                continue
            stats.searched += 1
            row = results.get(trace.task_id)
            gold, prompt = gold_of(row, trace), question_of(row, trace)
            if gold is None or not prompt:
                stats.without_gold += 1
                continue
            rows += stepwise_rows(trace, gold, prompt, str(run), (row or {}).get("dataset"))
    if not stats.searched:
        raise DistillError("no trace of a step search (beam, dvts, particle) in "
                           f"{', '.join(map(str, runs))}: stepwise rows come from their trees")
    stats.rows = write_rows(out, rows, "stepwise")
    stats.right_steps = sum(sum(r.labels) for r in rows)
    stats.wrong_steps = sum(len(r.labels) - sum(r.labels) for r in rows)
    return stats
