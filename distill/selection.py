"""Candidates -> rows: verification, the SFT rows and the preference pairs of each prompt.

The rules (finish and form, verification, rescued and easy prompts, diverse SFT
rows, refinement-edge and correct x incorrect pairs with length-bias control) are
described in :mod:`refinery.distill.dataset`.

Example:
    >>> problem = Problem(key="k", prompt="What is 3 * 4?", problem_id="p1", gold="12")
    >>> def candidate(raw):
    ...     return Candidate(problem_id="p1", run="runs/sc4", raw=raw)
    >>> problem.candidates = [candidate("3 * 4 = 12. \\\\boxed{12}"),
    ...                       candidate("3 * 4 = 7. \\\\boxed{7}")]
    >>> sft, pairs = build_rows([problem], BuildStats(), instruction=None)
    >>> [c.passed for c in problem.candidates], len(sft), len(pairs)
    ([True, False], 1, 1)
    >>> pairs[0].metadata.pair_source, pairs[0].metadata.rejected_answer
    ('correct_incorrect', '7')
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import networkx as nx

from refinery.distill.candidates import (
    CODE_VERIFIERS,
    EVAL_END,
    EXPLICIT_ANSWER,
    BuildStats,
    Candidate,
    Problem,
    clean_solution,
    normalized,
)
from refinery.distill.programs import program_rationale
from refinery.distill.schema import (
    ChatMessage,
    MessagesRow,
    PairProvenance,
    PairRow,
    PromptCompletionRow,
    Provenance,
    SFTFormat,
)
from refinery.verifiers.math import extract_answer, is_equivalent, normalize_answer

__all__ = ["ProgramRows", "PromptFilter", "build_rows", "provenance", "sft_row"]

PromptFilter = Literal["raft", "reinforce_rej"]
ProgramRows = Literal["rationale", "program"]

# Training repeats rows in proportion to their weight: a rescued prompt teaches the
# correction, an easy one teaches little.
RESCUED_WEIGHT, EASY_WEIGHT = 2.0, 0.5


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _inspect(c: Candidate, require_explicit: bool, math: bool = True,
             program_rows: ProgramRows = "rationale") -> None:
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
    if c.program is not None:
        _inspect_program(c, program_rows)
        return
    text = clean_solution(c.raw)
    if not math:
        c.text, c.drop = text, None if text else "malformed"
        return
    answer = extract_answer(text) if text else None
    if text is None or answer is None:
        c.drop = "malformed"
        return
    if require_explicit and not EXPLICIT_ANSWER.search(text):
        c.drop = "malformed"  # a correct last number in rambling text is luck, not a solution
        return
    ends = list(EVAL_END.finditer(c.raw))
    raw_answer = extract_answer(c.raw[ends[-1].end():] if ends else c.raw)
    if raw_answer is not None and not is_equivalent(raw_answer, answer):
        c.drop = "malformed"  # cleaning changed what the text answers
        return
    c.text, c.answer = text, answer


def _inspect_program(c: Candidate, program_rows: ProgramRows) -> None:
    """A program's answer is what its run printed; its row is the worked solution it
    stands for (``rationale``) or the program itself (``program``)."""
    if c.executed is None:
        c.drop = "failed_run"
        return
    c.answer = c.executed
    c.text = (program_rationale(c.program or "", c.executed) if program_rows == "rationale"
              else c.raw.strip())
    if not c.text:
        c.drop = "no_rationale"


def _verify(prob: Problem, *, min_confidence: float, min_voters: int) -> bool:
    """Give every usable candidate ``passed``; False when the prompt cannot be verified."""
    usable = [c for c in prob.candidates if c.drop is None]
    label_free = prob.verifier_name in CODE_VERIFIERS
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


def _descends(prob: Problem, child: Candidate, parent: Candidate) -> bool:
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
        k = normalized(c.text or "")
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


def provenance(prob: Problem, c: Candidate, weight: float, rescued: bool,
                easy: bool) -> dict[str, Any]:
    return {"source_run": c.run, "problem_id": c.problem_id, "dataset": prob.dataset,
            "level": prob.level, "run_strategy": c.run_strategy, "strategy": c.strategy,
            "step": c.step, "iteration": c.iteration, "event_id": c.event_id,
            "verifier": c.verifier or prob.verifier_name, "model": c.model, "weight": weight,
            "rescued": rescued, "easy": easy, "answer": c.answer}


def sft_row(prob: Problem, c: Candidate, meta: dict[str, Any], instruction: str | None,
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
        if normalized(ch.text or "") == normalized(rj.text or ""):
            continue
        ok.append((ch, rj))
    used: Counter[int] = Counter()
    seen: set[tuple[str, str]] = set()
    out: list[tuple[Candidate, Candidate]] = []
    while ok and len(out) < cap:
        ch, rj = min(ok, key=lambda p: (used[id(p[0])] + used[id(p[1])],
                                        abs(_length_ratio(*p) - 1.0)))
        ok.remove((ch, rj))
        key = (normalized(ch.text or ""), normalized(rj.text or ""))
        if key in seen:
            continue
        seen.add(key)
        used[id(ch)] += 1
        used[id(rj)] += 1
        out.append((ch, rj))
    return out


def build_rows(problems: Sequence[Problem], stats: BuildStats, *,
               instruction: str | None = None, sft_format: SFTFormat = "messages",
               max_per_prompt: int = 4, max_pairs_per_prompt: int = 4,
               max_length_ratio: float = 1.5, require_explicit_answer: bool = True,
               min_confidence: float = 0.8, min_voters: int = 3,
               prompt_filter: PromptFilter = "raft", program_rows: ProgramRows = "rationale",
               ) -> tuple[list[MessagesRow | PromptCompletionRow], list[PairRow]]:
    """Apply every selection rule to loaded problems; return validated SFT rows and pairs.

    ``prompt_filter``: ``raft`` keeps every rewarded attempt; ``reinforce_rej`` also
    drops prompts whose attempts all passed (nothing left to learn there).
    """
    sft: list[MessagesRow | PromptCompletionRow] = []
    pairs: list[PairRow] = []
    drops: Counter[str] = Counter()
    for prob in problems:
        stats.candidates += len(prob.candidates)
        for c in prob.candidates:
            _inspect(c, require_explicit_answer, math=prob.verifier_name not in CODE_VERIFIERS,
                     program_rows=program_rows)
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
        wrong = len(failing) + sum(c.drop == "failed_run" for c in prob.candidates)
        if prompt_filter == "reinforce_rej" and not wrong:
            stats.all_right += 1
            stats.filtered_all_right += 1
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
            sft.append(sft_row(prob, c, provenance(prob, c, weight, rescued, easy),
                                instruction, sft_format))
        stats.problems_with_sft += 1
        stats.weighted_sft_rows += weight * len(picked)
        if not failing:
            stats.all_right += 1
            continue
        chosen, source = _chosen_pairs(prob, passing, failing, max_pairs_per_prompt,
                                       max_length_ratio, stats)
        for ch, rj in chosen:
            meta = provenance(prob, ch, weight, rescued, easy)
            pairs.append(_pair_row(prob, ch, rj, meta, source, instruction))
            stats.pairs_by_source[source] = stats.pairs_by_source.get(source, 0) + 1
    _totals(stats, drops, sft, pairs)
    return sft, pairs


def _totals(stats: BuildStats, drops: Counter[str], sft: list[Any], pairs: list[PairRow]) -> None:
    stats.dropped = {k: v for k, v in sorted(drops.items()) if v}
    stats.sft_rows, stats.pairs = len(sft), len(pairs)
    if pairs:
        stats.mean_chosen_chars = round(
            sum(len(p.chosen[0].content) for p in pairs) / len(pairs), 1)
        stats.mean_rejected_chars = round(
            sum(len(p.rejected[0].content) for p in pairs) / len(pairs), 1)


def _rescuers(prob: Problem, passing: list[Candidate]) -> tuple[list[Candidate], bool]:
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


def _chosen_pairs(prob: Problem, passing: list[Candidate], failing: list[Candidate],
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


def _pair_row(prob: Problem, ch: Candidate, rj: Candidate, meta: dict[str, Any],
              source: str, instruction: str | None) -> PairRow:
    meta.update(pair_source=source, rejected_strategy=rj.strategy, rejected_step=rj.step,
                rejected_iteration=rj.iteration, rejected_event_id=rj.event_id,
                rejected_answer=rj.answer, length_ratio=round(_length_ratio(ch, rj), 4))
    return PairRow(prompt=_user_turns(prob.prompt, instruction),
                   chosen=[ChatMessage(role="assistant", content=ch.text or "")],
                   rejected=[ChatMessage(role="assistant", content=rj.text or "")],
                   metadata=PairProvenance.model_validate(meta))
