"""Traces -> training data: verified SFT rows and preference pairs (after RAFT / RLoop).

Input is one or more eval run directories (``results.jsonl`` + ``traces.jsonl``,
as :mod:`refinery.eval.runner` writes them). Every solution-writing generation in a
trace -- first drafts (``draft``), refinements (``refine``) and retries after a
loop alarm (``loop_retry``), each sample of an ``n>1`` request separately -- is
a *candidate*. Critiques, decompositions, judges, plans and votes are not.

Selection, in order:

1. **Finish and form.** Candidates that stopped on ``length`` or
   ``confidence`` (truncated: DeepConf's monitor stopped them), ``loop`` (the
   loop detector fired) or ``abort`` are dropped. The text is
   cleaned of scaffolding (:func:`clean_solution`); a candidate whose cleaned
   text is empty, still holds tags, lost its answer in cleaning, or has no
   explicit final answer (``\\boxed{}``, ``####``, "the answer is") is
   *malformed* and dropped.
2. **Verification.** With a gold answer (the run's ``results.jsonl``) each
   candidate's extracted answer is checked with :func:`refinery.verifiers.math.is_equivalent`;
   the candidate that is the run's final attempt keeps the runner's own verdict
   (``eval:<verifier>``). Runs on code datasets are verified by the runner only, so
   only their final attempts count. The gold is used for this check only: it
   never appears in a row. Without gold, a prompt counts as verified only if
   several label-free signals agree: some final attempt has the strategy's own
   confidence (``Attempt.score``: SSR's step confidence, SC's vote share, ...)
   of at least ``min_confidence`` *and* the majority answer of at least
   ``min_voters`` clean candidates is that same answer (``verifier="agreement"``).
3. **Prompts.** Candidates are grouped by prompt (across runs). A prompt with no
   passing candidate gives nothing. A prompt is *rescued* when a wrong (or
   unfinished) first draft has a passing refinement descending from it in the
   provenance DAG: its rows get weight 2. A prompt is *easy* when every first
   draft already passed: it gives a single SFT example at weight 0.5 (training
   repeats rows in proportion to their weight) and, being all-right, usually no
   pair.
4. **SFT rows.** Passing candidates, deduplicated on normalised text (case and
   whitespace), at most ``max_per_prompt`` (4) per prompt, chosen greedily to
   favour distinct solutions (lowest word-set overlap with those already
   chosen; the rescuing refinements and the final attempt first).
5. **Pairs.** If the prompt has refinement edges (a wrong draft -> a verified
   refinement descending from it), those are its pairs (rejected = the wrong
   draft). Otherwise correct x incorrect candidates of the prompt, spread so that
   chosen and rejected texts repeat as little as possible. All-right and
   all-wrong prompts give none. At most ``max_pairs_per_prompt`` (4). Length-bias
   control: a pair whose chosen text is more than ``max_length_ratio`` (1.5) times
   longer than its rejected text is skipped (DPO otherwise learns "longer is
   better"), and among the candidate pairings the least length-skewed come first.

The user turn is the original prompt (plus ``instruction``, if given, so the
rows match the prompt the evaluation strategy will send); the assistant turn is
the clean solution. Every row carries provenance in ``metadata`` and is
validated by :mod:`refinery.distill.schema` when written.

Example:
    >>> stats = build(["runs/sc4-train"], "out/sft.jsonl", "out/pairs.jsonl")
    >>> stats.sft_rows, stats.pairs, stats.rescued
    (112, 37, 9)
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, Field

from refinery.distill.schema import (
    ChatMessage,
    DistillError,
    MessagesRow,
    PairProvenance,
    PairRow,
    PromptCompletionRow,
    Provenance,
    SFTFormat,
    scaffold_leak,
    write_rows,
)
from refinery.engine.trace import StepKind, Trace, read_traces
from refinery.engine.types import FinishReason
from refinery.strategies.cot import INSTRUCTION as COT_INSTRUCTION
from refinery.verifiers.math import extract_answer, extract_boxed, is_equivalent, normalize_answer

__all__ = [
    "SOLUTION_STEPS",
    "BuildStats",
    "Candidate",
    "arith_solution",
    "build",
    "build_rows",
    "clean_solution",
    "gold_sft_rows",
    "load_candidates",
]

SOLUTION_STEPS = frozenset({"draft", "refine", "loop_retry"})
"""Generation steps whose output is a full solution of the task."""

RESCUED_WEIGHT, EASY_WEIGHT = 2.0, 0.5
_CODE_VERIFIERS = {"code"}

# ------------------------------------------------------------------------------ cleaning

_BLOCK = re.compile(r"<\s*(evaluation|reflection|plan|critique|feedback|review|think)\s*>"
                    r".*?<\s*/\s*\1\s*>", re.S | re.I)
_EVAL_END = re.compile(r"<\s*/\s*evaluation\s*>", re.I)
# SSR's first-person reflection ('Wait, in the sub-step "..." I got ...') echoed by the model.
_REFLECTION = re.compile(r"^[ \t*]*Wait, in the sub-step\b.*$", re.M)
# "Sure! Here is the revised solution:" -- the refinement chat's framing, not a solution.
_PREAMBLE = re.compile(
    r"\A\s*[*#\s]*(?:sure|okay|ok|certainly|of course|here(?:'s| is)|revised|corrected|updated|"
    r"improved|new|re-?evaluat\w*)\b[^\n]{0,100}:[*\s]*\n", re.I)
_ANSWER_TAG = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.S | re.I)
_EXPLICIT = re.compile(r"\\boxed|####|\banswer\s*(?:is|:)", re.I)


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
    ends = list(_EVAL_END.finditer(t))
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


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


# ---------------------------------------------------------------------------- candidates


@dataclass
class Candidate:
    """One solution text from a trace (or a results row), with its verdict and fate.

    ``drop`` is ``None`` for a usable candidate, else why it was dropped
    (``loop``, ``truncated``, ``aborted``, ``malformed``, ``unverified``).

    Example:
        >>> problems, _ = load_candidates(["runs/sc4-train"])
        >>> [(c.step, c.finish_reason, c.drop) for c in problems[0].candidates][:2]
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
    text: str | None = None
    answer: str | None = None
    passed: bool | None = None
    verifier: str = ""
    drop: str | None = None


@dataclass
class _Problem:
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
        >>> stats = build(["runs/sc4-train"], "out/sft.jsonl", "out/pairs.jsonl")
        >>> stats.dropped
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


def _run_files(run: Path) -> tuple[Path | None, Path | None, dict[str, Any]]:
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


def _read_results(path: Path) -> dict[str, dict[str, Any]]:
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


def _question_of(row: dict[str, Any] | None, trace: Trace | None) -> str | None:
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


def _gold_of(row: dict[str, Any] | None, trace: Trace | None) -> str | None:
    """The gold answer from the result line, else from the trace's task record."""
    if row is not None and row.get("gold") not in (None, ""):
        return str(row["gold"])
    if trace is not None and trace.task is not None and trace.task.gold not in (None, ""):
        return trace.task.gold
    return None


def _candidates_of_trace(trace: Trace, run: str, row: dict[str, Any] | None,
                         run_strategy: str, model: str) -> tuple[list[Candidate], nx.DiGraph]:
    g = trace.graph()
    by_id = {e.id: e for e in trace.events}
    key = f"{run}::{trace.task_id}"
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
    att = trace.attempt
    if att is not None and att.text:
        # The final attempt's text equals one candidate's (after cleaning); prefer one
        # among the ancestors of the attempt's events, as sc's n samples share an event.
        target = clean_solution(att.text)
        roots = set()
        for eid in att.events:
            if eid in g:
                roots |= nx.ancestors(g, eid) | {eid}
        match = None
        if target is not None:
            same = [c for c in out if (ct := clean_solution(c.raw)) is not None
                    and _norm(ct) == _norm(target)]
            match = next((c for c in same if c.event_id in roots), same[0] if same else None)
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


def load_candidates(runs: Sequence[str | Path]) -> tuple[list[_Problem], BuildStats]:
    """Read runs into problems (grouped by prompt) holding their unverified candidates.

    Raises:
        DistillError: a run path that does not exist or holds no run files.
    """
    stats = BuildStats(runs=len(runs))
    problems: dict[str, _Problem] = {}
    for run_path in runs:
        run = Path(run_path)
        traces_p, results_p, cfg = _run_files(run)
        results = _read_results(results_p) if results_p else {}
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
            prompt = _question_of(row, trace)
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
            key = _norm(prompt)
            prob = problems.get(key)
            if prob is None:
                prob = problems[key] = _Problem(
                    key=key, prompt=prompt, problem_id=pid, dataset=dataset,
                    level=info.get("level"), verifier_name=vname)
            if prob.gold is None:
                prob.gold = _gold_of(row, trace)
            prob.runs.add(str(run))
            prob.candidates += cands
            prob.graphs[f"{run}::{pid}"] = g
    stats.problems = len(problems)
    return list(problems.values()), stats


# ---------------------------------------------------------------------------- verifying


def _inspect(c: Candidate, require_explicit: bool, math: bool = True) -> None:
    """Set ``text``/``answer`` or ``drop`` from the finish reason and the form.

    ``math=False`` (code): the text only has to survive cleaning; it has no answer line.
    """
    if c.finish_reason == "loop":
        c.drop = "loop"
    elif c.finish_reason in ("length", "confidence"):
        c.drop = "truncated"
    elif c.finish_reason == "abort":
        c.drop = "aborted"
    if c.drop:
        return
    text = clean_solution(c.raw)
    if not math:
        c.text, c.drop = text, None if text else "malformed"
        return
    answer = extract_answer(text) if text else None
    if text is None or answer is None:
        c.drop = "malformed"
        return
    if require_explicit and not _EXPLICIT.search(text):
        c.drop = "malformed"  # a correct last number in rambling text is luck, not a solution
        return
    ends = list(_EVAL_END.finditer(c.raw))
    raw_answer = extract_answer(c.raw[ends[-1].end():] if ends else c.raw)
    if raw_answer is not None and not is_equivalent(raw_answer, answer):
        c.drop = "malformed"  # cleaning changed what the text answers
        return
    c.text, c.answer = text, answer


def _verify(prob: _Problem, *, min_confidence: float, min_voters: int) -> bool:
    """Give every usable candidate ``passed``; False when the prompt cannot be verified."""
    usable = [c for c in prob.candidates if c.drop is None]
    label_free = prob.verifier_name in _CODE_VERIFIERS
    if prob.gold is not None and not label_free:
        for c in usable:
            if c.is_final and c.passed is not None:
                c.verifier = f"eval:{prob.verifier_name}"
            else:
                c.passed = is_equivalent(c.answer, prob.gold)
                c.verifier = prob.verifier_name
        return True
    if label_free:  # only the runner's own verdicts (it ran the hidden tests)
        for c in usable:
            if c.is_final and c.passed is not None:
                c.verifier = f"eval:{prob.verifier_name}"
            else:
                c.drop = "unverified"
        return any(c.drop is None for c in prob.candidates)
    # No gold: agreement of label-free signals.
    votes = Counter(normalize_answer(c.answer) for c in usable if c.answer)
    voters = sum(votes.values())
    pseudo = None
    if voters >= min_voters:
        top, count = votes.most_common(1)[0]
        if count / voters > 0.5:
            for c in prob.candidates:
                if (c.is_final and c.answer and c.score is not None
                        and c.score >= min_confidence and normalize_answer(c.answer) == top):
                    pseudo = c.answer
                    break
    if pseudo is None:
        for c in usable:
            c.drop = "unverified"
        return False
    for c in usable:
        c.passed = is_equivalent(c.answer, pseudo)
        c.verifier = "agreement"
    return True


# ----------------------------------------------------------------------------- selection


def _descends(prob: _Problem, child: Candidate, parent: Candidate) -> bool:
    if child.trace_key != parent.trace_key or not child.event_id or not parent.event_id:
        return False
    g = prob.graphs.get(child.trace_key)
    if g is None or parent.event_id not in g or child.event_id not in g:
        return False
    return child.event_id != parent.event_id and nx.has_path(g, parent.event_id, child.event_id)


def _dedupe(cands: Iterable[Candidate]) -> tuple[list[Candidate], int]:
    seen: set[str] = set()
    out, dup = [], 0
    for c in cands:
        k = _norm(c.text or "")
        if k in seen:
            dup += 1
            continue
        seen.add(k)
        out.append(c)
    return out, dup


def _diverse(cands: list[Candidate], k: int) -> list[Candidate]:
    """Up to ``k`` candidates, greedily the least like those already picked (order = priority)."""
    if len(cands) <= k:
        return list(cands)
    words = [_words(c.text or "") for c in cands]
    picked = [0]
    while len(picked) < k:
        best = min((i for i in range(len(cands)) if i not in picked),
                   key=lambda i: (max(_overlap(words[i], words[j]) for j in picked), i))
        picked.append(best)
    return [cands[i] for i in sorted(picked)]


def _user_turns(prompt: str, instruction: str | None) -> list[ChatMessage]:
    content = f"{prompt}\n\n{instruction}" if instruction else prompt
    return [ChatMessage(role="user", content=content)]


def _provenance(prob: _Problem, c: Candidate, weight: float, rescued: bool,
                easy: bool) -> dict[str, Any]:
    return {"source_run": c.run, "problem_id": c.problem_id, "dataset": prob.dataset,
            "level": prob.level, "run_strategy": c.run_strategy, "strategy": c.strategy,
            "step": c.step, "iteration": c.iteration, "event_id": c.event_id,
            "verifier": c.verifier or prob.verifier_name, "model": c.model, "weight": weight,
            "rescued": rescued, "easy": easy, "answer": c.answer}


def _sft_row(prob: _Problem, c: Candidate, meta: dict[str, Any], instruction: str | None,
             sft_format: SFTFormat) -> MessagesRow | PromptCompletionRow:
    user = _user_turns(prob.prompt, instruction)
    reply = ChatMessage(role="assistant", content=c.text or "")
    if sft_format == "prompt_completion":
        return PromptCompletionRow(prompt=user, completion=[reply],
                                   metadata=Provenance.model_validate(meta))
    return MessagesRow(messages=[*user, reply], metadata=Provenance.model_validate(meta))


def _length_ratio(chosen: Candidate, rejected: Candidate) -> float:
    return len(chosen.text or "") / max(1, len(rejected.text or ""))


def _pick_pairs(options: list[tuple[Candidate, Candidate]], cap: int, max_ratio: float,
                stats: BuildStats) -> list[tuple[Candidate, Candidate]]:
    """Up to ``cap`` pairs: no over-long chosen, no repeated pair, each text reused least."""
    ok = []
    for ch, rj in options:
        if _length_ratio(ch, rj) > max_ratio:
            stats.pairs_skipped_length += 1
            continue
        if _norm(ch.text or "") == _norm(rj.text or ""):
            continue
        ok.append((ch, rj))
    used: Counter[int] = Counter()
    seen: set[tuple[str, str]] = set()
    out: list[tuple[Candidate, Candidate]] = []
    while ok and len(out) < cap:
        ch, rj = min(ok, key=lambda p: (used[id(p[0])] + used[id(p[1])],
                                        abs(_length_ratio(*p) - 1.0)))
        ok.remove((ch, rj))
        key = (_norm(ch.text or ""), _norm(rj.text or ""))
        if key in seen:
            continue
        seen.add(key)
        used[id(ch)] += 1
        used[id(rj)] += 1
        out.append((ch, rj))
    return out


def build_rows(problems: Sequence[_Problem], stats: BuildStats, *,
               instruction: str | None = None, sft_format: SFTFormat = "messages",
               max_per_prompt: int = 4, max_pairs_per_prompt: int = 4,
               max_length_ratio: float = 1.5, require_explicit_answer: bool = True,
               min_confidence: float = 0.8, min_voters: int = 3,
               ) -> tuple[list[MessagesRow | PromptCompletionRow], list[PairRow]]:
    """Apply every selection rule to loaded problems; return validated SFT rows and pairs."""
    sft: list[MessagesRow | PromptCompletionRow] = []
    pairs: list[PairRow] = []
    drops: Counter[str] = Counter()
    for prob in problems:
        stats.candidates += len(prob.candidates)
        for c in prob.candidates:
            _inspect(c, require_explicit_answer, math=prob.verifier_name not in _CODE_VERIFIERS)
        verified = _verify(prob, min_confidence=min_confidence, min_voters=min_voters)
        drops.update(c.drop for c in prob.candidates if c.drop)  # _verify may drop some
        if not verified:
            continue
        usable = [c for c in prob.candidates if c.drop is None and c.passed is not None]
        passing, dup_p = _dedupe(c for c in usable if c.passed)
        failing, dup_f = _dedupe(c for c in usable if not c.passed)
        drops["duplicate"] += dup_p + dup_f
        if not passing:
            stats.no_passing_attempt += 1
            stats.all_wrong += 1
            continue
        rescuers, easy = _rescuers(prob, passing)
        rescued = bool(rescuers)
        weight = RESCUED_WEIGHT if rescued else EASY_WEIGHT if easy else 1.0
        stats.rescued += rescued
        stats.easy += easy

        # SFT: rescuing refinements first, then final attempts, then the rest, in order.
        ranked = sorted(passing, key=lambda c: (c not in rescuers, not c.is_final))
        picked = _diverse(ranked, 1 if easy else max_per_prompt)
        stats.capped += len(ranked) - len(picked)
        for c in picked:
            sft.append(_sft_row(prob, c, _provenance(prob, c, weight, rescued, easy),
                                instruction, sft_format))
        stats.problems_with_sft += 1
        stats.weighted_sft_rows += weight * len(picked)
        if not failing:
            stats.all_right += 1
            continue
        chosen, source = _chosen_pairs(prob, passing, failing, max_pairs_per_prompt,
                                       max_length_ratio, stats)
        for ch, rj in chosen:
            meta = _provenance(prob, ch, weight, rescued, easy)
            pairs.append(_pair_row(prob, ch, rj, meta, source, instruction))
            stats.pairs_by_source[source] = stats.pairs_by_source.get(source, 0) + 1
    stats.dropped = {k: v for k, v in sorted(drops.items()) if v}
    stats.sft_rows, stats.pairs = len(sft), len(pairs)
    if pairs:
        stats.mean_chosen_chars = round(
            sum(len(p.chosen[0].content) for p in pairs) / len(pairs), 1)
        stats.mean_rejected_chars = round(
            sum(len(p.rejected[0].content) for p in pairs) / len(pairs), 1)
    return sft, pairs


def _rescuers(prob: _Problem, passing: list[Candidate]) -> tuple[list[Candidate], bool]:
    """The passing refinements that fixed a failed draft, and whether the problem was easy
    (every draft passed as it was)."""
    drafts = [c for c in prob.candidates if c.step == "draft"]
    easy = bool(drafts) and all(d.drop is None and d.passed for d in drafts)
    failed_drafts = [d for d in drafts if d.drop in ("loop", "truncated", "aborted",
                                                     "malformed") or d.passed is False]
    # Refinements only (iteration > 0): a loop retry of a draft is a retry, not a rescue.
    rescuers = [c for c in passing if c.iteration > 0
                and any(_descends(prob, c, d) for d in failed_drafts)]
    # A final attempt that passed in a trace whose every draft failed is a rescue too.
    for c in passing:
        if c.is_final and c.iteration > 0 and c not in rescuers:
            trace_drafts = [d for d in drafts if d.trace_key == c.trace_key]
            if trace_drafts and all(d in failed_drafts for d in trace_drafts):
                rescuers.append(c)
    return rescuers, easy


def _chosen_pairs(prob: _Problem, passing: list[Candidate], failing: list[Candidate],
                  max_pairs: int, max_ratio: float, stats: BuildStats,
                  ) -> tuple[list[tuple[Candidate, Candidate]], str]:
    """(chosen, rejected) pairs: refinement edges from a failed draft to a passing
    descendant, the most direct first; else any passing against any failing attempt."""
    edges = [(c, d) for d in failing if d.step == "draft" or d.iteration == 0
             for c in passing if _descends(prob, c, d)]
    edges.sort(key=lambda p: p[0].iteration - p[1].iteration)
    chosen = _pick_pairs(edges, max_pairs, max_ratio, stats)
    if chosen:
        return chosen, "refinement_edge"
    combos = [(c, d) for c in passing for d in failing]
    return _pick_pairs(combos, max_pairs, max_ratio, stats), "correct_incorrect"


def _pair_row(prob: _Problem, ch: Candidate, rj: Candidate, meta: dict[str, Any],
              source: str, instruction: str | None) -> PairRow:
    meta.update(pair_source=source, rejected_strategy=rj.strategy, rejected_step=rj.step,
                rejected_iteration=rj.iteration, rejected_event_id=rj.event_id,
                rejected_answer=rj.answer, length_ratio=round(_length_ratio(ch, rj), 4))
    return PairRow(prompt=_user_turns(prob.prompt, instruction),
                   chosen=[ChatMessage(role="assistant", content=ch.text or "")],
                   rejected=[ChatMessage(role="assistant", content=rj.text or "")],
                   metadata=PairProvenance.model_validate(meta))


def build(runs: Sequence[str | Path], sft_out: str | Path, pairs_out: str | Path | None = None,
          *, instruction: str | None = None, sft_format: SFTFormat = "messages",
          max_per_prompt: int = 4, max_pairs_per_prompt: int = 4,
          max_length_ratio: float = 1.5, require_explicit_answer: bool = True,
          min_confidence: float = 0.8, min_voters: int = 3,
          extra_sft: Sequence[MessagesRow | PromptCompletionRow] = ()) -> BuildStats:
    """Read eval runs, select training data, write the SFT (and pairs) JSONL files.

    Args:
        runs: run directories (or their ``traces.jsonl`` / ``results.jsonl``).
        sft_out: SFT rows, JSONL (written atomically, even when empty).
        pairs_out: preference rows, JSONL; ``None`` to skip pairs.
        instruction: appended to each prompt's user turn (e.g. plain cot's instruction,
            so training prompts match evaluation prompts); ``None`` = the prompt as is.
        sft_format: ``messages`` or ``prompt_completion``.
        max_per_prompt: SFT examples per prompt (easy prompts: 1).
        max_pairs_per_prompt: preference pairs per prompt.
        max_length_ratio: skip pairs whose chosen text is longer than this times the rejected.
        require_explicit_answer: a solution must state its answer (boxed, ####, "answer is").
        min_confidence, min_voters: the label-free agreement rule (runs without gold).
        extra_sft: rows added as they are (e.g. :func:`gold_sft_rows`).

    Returns:
        Counts of what was kept and dropped (also the output paths).

    Raises:
        DistillError: a run that does not exist or holds no run files.
    """
    problems, stats = load_candidates(runs)
    sft, pairs = build_rows(problems, stats, instruction=instruction, sft_format=sft_format,
                            max_per_prompt=max_per_prompt,
                            max_pairs_per_prompt=max_pairs_per_prompt,
                            max_length_ratio=max_length_ratio,
                            require_explicit_answer=require_explicit_answer,
                            min_confidence=min_confidence, min_voters=min_voters)
    if extra_sft:
        sft += list(extra_sft)
        stats.sft_rows = len(sft)
        stats.weighted_sft_rows += sum(r.metadata.weight for r in extra_sft)
    stats.sft_path = str(sft_out)
    write_rows(sft_out, sft, "sft")
    if pairs_out is not None:
        stats.pairs_path = str(pairs_out)
        write_rows(pairs_out, pairs, "pair")
    return stats


# ------------------------------------------------------------------------- gold fallback

_START = re.compile(r"\bhas (\d+) ")


def arith_solution(prompt: str, steps: Sequence[str], gold: str) -> str | None:
    """A worked solution of an ``arith`` problem from its operation trail, or ``None``.

    Example:
        >>> arith_solution("Ava has 5 apples. Ava buys 3 more apples. How many ...?",
        ...                ["+3"], "8")
        'Ava starts with 5.\\n5 + 3 = 8.\\nThe answer is \\\\boxed{8}.'
    """
    m = _START.search(prompt)
    if not m:
        return None
    value = int(m.group(1))
    name = prompt.split(" has ", 1)[0].strip()
    lines = [f"{name} starts with {value}."]
    for s in steps:
        op, k = s[0], int(s[1:])
        new = {"+": value + k, "-": value - k, "*": value * k,
               "/": value // k if k else value}[op]
        sym = {"+": "+", "-": "-", "*": "×", "/": "÷"}[op]
        lines.append(f"{value} {sym} {k} = {new}.")
        value = new
    if str(value) != str(gold).strip():
        return None
    lines.append(f"The answer is \\boxed{{{value}}}.")
    return "\n".join(lines)


def gold_sft_rows(examples: Iterable[Any], *, instruction: str | None = None,
                  sft_format: SFTFormat = "messages", source: str = "gold",
                  weight: float = 1.0) -> list[MessagesRow | PromptCompletionRow]:
    """SFT rows from reference solutions of ``arith`` examples (``refinery.eval.datasets.Example``).

    Used only as a documented fallback when a model solves too few training problems
    to exercise the pipeline; rows say ``step="gold_solution"``, ``verifier="gold"``.
    """
    rows: list[MessagesRow | PromptCompletionRow] = []
    for ex in examples:
        steps = (getattr(ex, "private", {}) or {}).get("steps")
        if not steps or ex.gold is None:
            continue
        text = arith_solution(ex.prompt, steps, ex.gold)
        if text is None:
            continue
        prob = _Problem(key=_norm(ex.prompt), prompt=ex.prompt, problem_id=ex.id,
                        dataset=ex.dataset, level=ex.level)
        c = Candidate(problem_id=ex.id, run=source, raw=text, step="gold_solution",
                      strategy="gold", text=text, answer=str(ex.gold), verifier="gold")
        rows.append(_sft_row(prob, c, _provenance(prob, c, weight, False, False),
                             instruction, sft_format))
    return rows
