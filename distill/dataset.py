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
   *malformed* and dropped. A program (``pot``) is judged by its run: one that
   failed is dropped (``failed_run``), one that ran answers what it printed, and
   its text is the worked solution it stands for (``program_rows="rationale"``,
   :mod:`~refinery.distill.programs`; ``no_rationale`` when it cannot be read) or
   the program itself (``program_rows="program"``).
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
   pair. With ``prompt_filter="reinforce_rej"`` an all-right prompt gives nothing
   (Reinforce-Rej: a prompt every attempt solves teaches nothing; RAFT, the
   default, keeps it).
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

The pieces: :mod:`~refinery.distill.candidates` reads runs into candidates,
:mod:`~refinery.distill.selection` verifies them and builds the rows,
:mod:`~refinery.distill.gold_fallback` makes reference-solution rows; this module
puts them together and writes the files.

Example:
    >>> stats = build(["runs/sc4-train"], "out/sft.jsonl", "out/pairs.jsonl")  # doctest: +SKIP
    >>> stats.sft_rows, stats.pairs, stats.rescued  # doctest: +SKIP
    (112, 37, 9)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from refinery.distill.candidates import (
    SOLUTION_STEPS,
    BuildStats,
    Candidate,
    clean_solution,
    load_candidates,
)
from refinery.distill.gold_fallback import arith_solution, gold_sft_rows
from refinery.distill.schema import MessagesRow, PromptCompletionRow, SFTFormat, write_rows
from refinery.distill.selection import ProgramRows, PromptFilter, build_rows

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


def build(runs: Sequence[str | Path], sft_out: str | Path, pairs_out: str | Path | None = None,
          *, instruction: str | None = None, sft_format: SFTFormat = "messages",
          max_per_prompt: int = 4, max_pairs_per_prompt: int = 4,
          max_length_ratio: float = 1.5, require_explicit_answer: bool = True,
          min_confidence: float = 0.8, min_voters: int = 3,
          prompt_filter: PromptFilter = "raft", program_rows: ProgramRows = "rationale",
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
        prompt_filter: ``raft`` (every verified attempt) or ``reinforce_rej`` (prompts
            whose attempts all passed are dropped too).
        program_rows: a verified program (``pot``) becomes the worked solution it
            stands for (``rationale``, :mod:`~refinery.distill.programs`) or stays code.
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
                            min_confidence=min_confidence, min_voters=min_voters,
                            prompt_filter=prompt_filter, program_rows=program_rows)
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
