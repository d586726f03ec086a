"""Eval runs -> candidates: every solution a run's traces hold, grouped by prompt.

A candidate is a solution-writing generation of a trace (a first draft, a
refinement, a retry after a loop alarm; each sample of an ``n>1`` request
separately), with the run's gold answer and the provenance graph of its trace, so
the selection (:mod:`refinery.distill.selection`) can verify it and find the
refinements that rescued a wrong draft. :func:`clean_solution` strips the
scaffolding strategies write around a solution.

Example:
    >>> problems, stats = load_candidates(["runs/sc4-train"])  # doctest: +SKIP
    >>> len(problems[0].candidates), stats.candidates  # doctest: +SKIP
    (8, 1600)
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, Field

from refinery.distill.schema import (
    DistillError,
    scaffold_leak,
)
from refinery.engine.trace import StepKind, Trace, TraceEvent, read_traces
from refinery.engine.types import Attempt, FinishReason
from refinery.strategies.cot import INSTRUCTION as COT_INSTRUCTION
from refinery.strategies.execution import program_block, read_program
from refinery.verifiers.math import extract_boxed

__all__ = ["SOLUTION_STEPS", "BuildStats", "Candidate", "Problem", "clean_solution",
           "gold_of", "load_candidates", "normalized", "question_of", "read_results",
           "run_files"]

SOLUTION_STEPS = frozenset({"draft", "refine", "loop_retry"})
"""Generation steps whose output is a full solution of the task."""
CODE_VERIFIERS = {"code"}

# ------------------------------------------------------------------------------ cleaning

_BLOCK = re.compile(r"<\s*(evaluation|reflection|plan|critique|feedback|review|think)\s*>"
                    r".*?<\s*/\s*\1\s*>", re.S | re.I)
EVAL_END = re.compile(r"<\s*/\s*evaluation\s*>", re.I)
# SSR's first-person reflection ('Wait, in the sub-step "..." I got ...') echoed by the model.
_REFLECTION = re.compile(r"^[ \t*]*Wait, in the sub-step\b.*$", re.M)
# "Sure! Here is the revised solution:" -- the refinement chat's framing, not a solution.
_PREAMBLE = re.compile(
    r"\A\s*[*#\s]*(?:sure|okay|ok|certainly|of course|here(?:'s| is)|revised|corrected|updated|"
    r"improved|new|re-?evaluat\w*)\b[^\n]{0,100}:[*\s]*\n", re.I)
_ANSWER_TAG = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.S | re.I)
EXPLICIT_ANSWER = re.compile(r"\\boxed|####|\banswer\s*(?:is|:)", re.I)


def clean_solution(text: str) -> str | None:
    """The solution without refinement scaffolding, or ``None`` if nothing clean is left.

    Drops ``<evaluation>`` (and reflection, plan, critique, feedback, think)
    blocks -- with SSR's convention that the new trajectory follows the last
    ``</evaluation>`` --, echoed SSR reflections, and a leading "Here is the
    revised solution:" line. ``<answer>X</answer>`` keeps X as plain text; the last
    one becomes ``\\boxed{X}`` when the text boxes nothing else, the form plain
    ``cot`` asks for, so the model learns to answer without the scaffold.

    Example:
        >>> clean_solution("<evaluation>step 2 was wrong</evaluation>\\n3*4 = 12. "
        ...                "<answer>12</answer>")
        '3*4 = 12. \\\\boxed{12}'
    """
    t = text or ""
    ends = list(EVAL_END.finditer(t))
    if ends:
        t = t[ends[-1].end():]
    t = _BLOCK.sub("", t)
    t = _REFLECTION.sub("", t)
    t = _PREAMBLE.sub("", t, count=1)
    tags = list(_ANSWER_TAG.finditer(t))
    if tags:
        boxed_elsewhere = extract_boxed(_ANSWER_TAG.sub("", t)) is not None
        last = tags[-1]

        def plain(m: re.Match[str]) -> str:
            inner = m.group(1).strip()
            if m.start() == last.start() and inner and not boxed_elsewhere \
                    and "\\boxed" not in inner:
                return "\\boxed{" + inner.strip("$ ") + "}"
            return inner

        t = _ANSWER_TAG.sub(plain, t)
    t = re.sub(r"[ \t]+\n", "\n", t)
    t = re.sub(r"\n{3,}", "\n\n", t).strip()
    if not t or scaffold_leak(t):
        return None
    return t


def normalized(text: str) -> str:
    return " ".join(text.lower().split())


# ---------------------------------------------------------------------------- candidates


@dataclass
class Candidate:
    """One solution text from a trace (or a results row), with its verdict and fate.

    ``drop`` is ``None`` for a usable candidate, else why it was dropped
    (``loop``, ``truncated``, ``aborted``, ``malformed``, ``unverified``).

    Example:
        >>> problems, _ = load_candidates(["runs/sc4-train"])  # doctest: +SKIP
        >>> first = problems[0].candidates[:2]  # doctest: +SKIP
        >>> [(c.step, c.finish_reason, c.drop) for c in first]  # doctest: +SKIP
        [('draft', 'stop', None), ('draft', 'length', None)]
    """

    problem_id: str
    run: str
    raw: str
    finish_reason: FinishReason = "stop"
    step: StepKind | Literal["gold_solution"] = "draft"
    strategy: str = ""
    run_strategy: str = ""
    model: str = ""
    event_id: str | None = None
    index: int = 0
    iteration: int = 0
    trace_key: str = ""
    is_final: bool = False
    score: float | None = None  # the strategy's own confidence (final attempts)
    program: str | None = None  # a program the sandbox ran (pot): its reply is code
    executed: str | None = None  # what that run printed (None: it failed)
    text: str | None = None
    answer: str | None = None
    passed: bool | None = None
    verifier: str = ""
    drop: str | None = None


@dataclass
class Problem:
    key: str
    prompt: str
    problem_id: str
    dataset: str | None = None
    level: int | None = None
    gold: str | None = None
    verifier_name: str = "math"
    runs: set[str] = field(default_factory=set)
    candidates: list[Candidate] = field(default_factory=list)
    graphs: dict[str, nx.DiGraph] = field(default_factory=dict)


class BuildStats(BaseModel):
    """What :func:`build` kept and dropped, and why.

    Example:
        >>> from refinery.distill.dataset import build
        >>> stats = build(["runs/sc4-train"], "out/sft.jsonl", "out/pairs.jsonl")  # doctest: +SKIP
        >>> stats.dropped  # doctest: +SKIP
        {'malformed': 410, 'truncated': 183}
    """

    runs: int = 0
    traces: int = 0
    problems: int = 0
    problems_with_sft: int = 0
    candidates: int = 0
    dropped: dict[str, int] = Field(default_factory=dict)
    no_passing_attempt: int = 0
    rescued: int = 0
    easy: int = 0
    capped: int = 0
    sft_rows: int = 0
    weighted_sft_rows: float = 0.0
    pairs: int = 0
    pairs_by_source: dict[str, int] = Field(default_factory=dict)
    pairs_skipped_length: int = 0
    all_right: int = 0
    filtered_all_right: int = 0  # all-right prompts left out (prompt_filter="reinforce_rej")
    all_wrong: int = 0
    mean_chosen_chars: float | None = None
    mean_rejected_chars: float | None = None
    sft_path: str | None = None
    pairs_path: str | None = None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def run_files(run: Path) -> tuple[Path | None, Path | None, dict[str, Any]]:
    """(traces, results, config) of a run directory, or of a traces/results JSONL file."""
    if run.is_dir():
        traces, results = run / "traces.jsonl", run / "results.jsonl"
        cfg = _read_json(run / "config.json")
    elif run.is_file():
        traces = run if run.name != "results.jsonl" else run.with_name("traces.jsonl")
        results = run if run.name == "results.jsonl" else run.with_name("results.jsonl")
        cfg = _read_json(run.with_name("config.json"))
    else:
        raise DistillError(f"run {run} does not exist")
    traces_p = traces if traces.is_file() and traces.name != "results.jsonl" else None
    results_p = results if results.is_file() else None
    if traces_p is None and results_p is None:
        raise DistillError(f"{run} holds neither traces.jsonl nor results.jsonl "
                           "(is it an eval run directory?)")
    return traces_p, results_p, cfg


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """A run's result lines by problem id (a torn or non-JSON line skipped)."""
    rows: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n") or not line.strip():
                continue  # a torn last line (crash mid-write)
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "id" in row:
                rows[str(row["id"])] = row
    return rows


def question_of(row: dict[str, Any] | None, trace: Trace | None) -> str | None:
    """The task question: as the trace recorded it, else the result line's prompt,
    else (traces written before the task was recorded) recovered from the request."""
    if trace is not None and trace.task is not None:
        return trace.task.question
    if row is not None and row.get("prompt"):
        return str(row["prompt"])
    return _prompt_from_draft(trace) if trace is not None else None


def _prompt_from_draft(trace: Trace) -> str | None:
    """The first draft's request minus cot's instruction (for old traces only)."""
    for e in trace.events:
        if e.kind == "generation" and e.step == "draft" and e.messages:
            users = [m.content for m in e.messages if m.role == "user"]
            if users:
                q = users[-1]
                return (q[: -len(COT_INSTRUCTION)].rstrip() if q.endswith(COT_INSTRUCTION)
                        else q)
    return None


def gold_of(row: dict[str, Any] | None, trace: Trace | None) -> str | None:
    """The gold answer from the result line, else from the trace's task record."""
    if row is not None and row.get("gold") not in (None, ""):
        return str(row["gold"])
    if trace is not None and trace.task is not None and trace.task.gold not in (None, ""):
        return trace.task.gold
    return None


PROGRAM_STRATEGIES = frozenset({"pot"})
"""Strategies whose solution generations are programs judged by their run."""


def _runs_of(trace: Trace) -> dict[str, list[TraceEvent]]:
    """Each generation's ``execute`` events (a request of n programs has n)."""
    runs: dict[str, list[TraceEvent]] = {}
    for e in trace.events:
        if e.kind == "step" and e.step == "execute":
            for p in e.parents:
                runs.setdefault(p, []).append(e)
    return runs


def _attach_run(c: Candidate, runs: list[TraceEvent]) -> None:
    """Mark ``c`` as a program with the answer its own run printed."""
    c.program = read_program(c.raw)
    shown = program_block(c.program)
    for r in runs:
        if (r.text or "").startswith(shown):
            c.executed = r.data.get("answer") if r.data.get("ok") else None
            return


def _final_of(att: Attempt, out: list[Candidate], g: nx.DiGraph) -> Candidate | None:
    """The candidate the final attempt is: the same text after cleaning (for a program,
    the same program), preferring one among the ancestors of the attempt's events, as
    sc's n samples share an event."""
    roots: set[str] = set()
    for eid in att.events:
        if eid in g:
            roots |= nx.ancestors(g, eid) | {eid}
    programs = [c for c in out if c.program is not None]
    if programs and att.text.startswith("```python\n"):
        same = [c for c in programs if att.text.startswith(program_block(c.program or ""))]
    elif (target := clean_solution(att.text)) is not None:
        same = [c for c in out if (ct := clean_solution(c.raw)) is not None
                and normalized(ct) == normalized(target)]
    else:
        same = []
    return next((c for c in same if c.event_id in roots), same[0] if same else None)


def _candidates_of_trace(trace: Trace, run: str, row: dict[str, Any] | None,
                         run_strategy: str, model: str) -> tuple[list[Candidate], nx.DiGraph]:
    g = trace.graph()
    by_id = {e.id: e for e in trace.events}
    key = f"{run}::{trace.task_id}"
    runs = _runs_of(trace)
    out: list[Candidate] = []
    for e in trace.events:
        if e.kind != "generation" or e.step not in SOLUTION_STEPS or not e.completions:
            continue
        above = nx.ancestors(g, e.id) | {e.id} if e.id in g else {e.id}
        iteration = sum(1 for a in above if a in by_id and by_id[a].kind == "generation"
                        and by_id[a].step == "refine")
        for i, c in enumerate(e.completions):
            out.append(Candidate(problem_id=trace.task_id, run=run, raw=c.text,
                                 finish_reason=c.finish_reason, step=e.step,
                                 strategy=e.strategy, run_strategy=run_strategy, model=model,
                                 event_id=e.id, index=i, iteration=iteration, trace_key=key))
            if e.strategy in PROGRAM_STRATEGIES:
                _attach_run(out[-1], runs.get(e.id, []))
    att = trace.attempt
    if att is not None and att.text:
        match = _final_of(att, out, g)
        if match is None:  # text the strategy composed itself: a candidate of its own
            match = Candidate(problem_id=trace.task_id, run=run, raw=att.text,
                              finish_reason=att.finish_reason, step="final",
                              strategy=att.strategy, run_strategy=run_strategy, model=model,
                              event_id=(att.events or [None])[0], trace_key=key,
                              iteration=max((c.iteration for c in out), default=0))
            out.append(match)
        match.is_final = True
        match.score = att.score
        if row is not None and row.get("passed") is not None:
            match.passed = bool(row["passed"])
    return out, g


def load_candidates(runs: Sequence[str | Path]) -> tuple[list[Problem], BuildStats]:
    """Read runs into problems (grouped by prompt) holding their unverified candidates.

    Raises:
        DistillError: a run path that does not exist or holds no run files.
    """
    stats = BuildStats(runs=len(runs))
    problems: dict[str, Problem] = {}
    for run_path in runs:
        run = Path(run_path)
        traces_p, results_p, cfg = run_files(run)
        results = read_results(results_p) if results_p else {}
        ds = cfg.get("dataset") or {}
        cfg_verifier = ds.get("verifier") if isinstance(ds, dict) else None
        traces = read_traces(traces_p) if traces_p else []
        stats.traces += len(traces)
        items: list[tuple[dict[str, Any] | None, Trace | None]] = [
            (results.get(t.task_id), t) for t in traces]
        seen = {t.task_id for t in traces}
        # Problems with a result line but no trace: their final text is the one candidate.
        items += [(r, None) for rid, r in results.items() if rid not in seen]
        for row, trace in items:
            info = row or {}
            pid = trace.task_id if trace is not None else str(info["id"])
            prompt = question_of(row, trace)
            if not prompt:
                continue
            run_strategy = ((trace.strategy if trace else "") or info.get("strategy")
                            or (cfg.get("strategy") or {}).get("canonical") or "")
            model = (trace.model if trace else "") or info.get("model") or cfg.get("model") or ""
            dataset = info.get("dataset") or (ds.get("name") if isinstance(ds, dict) else None)
            vname = cfg_verifier or ("code" if dataset == "humaneval" else "math")
            if trace is not None:
                cands, g = _candidates_of_trace(trace, str(run), row, run_strategy, model)
            else:
                passed = info.get("passed")
                cands = [Candidate(problem_id=pid, run=str(run), raw=info.get("text") or "",
                                   finish_reason=info.get("finish_reason") or "stop",
                                   step="final", strategy=run_strategy,
                                   run_strategy=run_strategy, model=model,
                                   trace_key=f"{run}::{pid}", is_final=True,
                                   passed=None if passed is None else bool(passed))]
                g = nx.DiGraph()
            key = normalized(prompt)
            prob = problems.get(key)
            if prob is None:
                prob = problems[key] = Problem(
                    key=key, prompt=prompt, problem_id=pid, dataset=dataset,
                    level=info.get("level"), verifier_name=vname)
            if prob.gold is None:
                prob.gold = gold_of(row, trace)
            prob.runs.add(str(run))
            prob.candidates += cands
            prob.graphs[f"{run}::{pid}"] = g
    stats.problems = len(problems)
    return list(problems.values()), stats


# ---------------------------------------------------------------------------- verifying
