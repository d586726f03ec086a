"""Would a vote over thought and answer differ from the vote over answers?

A thinking model's sample is its thinking and its answer; ``sc`` votes over the
answers' extracted values (``Completion.text``), never the thinking. This reads
the traces of ``sc(...)`` runs and counts the problems where a vote over the
values extracted from each sample's raw text (thinking included: a ``\\boxed{}``
tried while thinking can win there) would pick another answer.

Example:
    $ python bench/thinking_votes.py runs/sc4-think runs/sc8-think
    >>> vote_differs([("4", "<think>\\\\boxed{9}</think>4"), ("4", "<think>\\\\boxed{9}</think>4")])
    True
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from refinery.verifiers.math import extract_answer

Sample = tuple[str | None, str]  # the answer's extracted value, the raw text


def majority(values: Sequence[str | None]) -> str | None:
    """The most common non-None value (ties: the first seen), as ``sc`` votes."""
    counts = Counter(v for v in values if v is not None)
    return max(counts, key=counts.__getitem__) if counts else None


def vote_differs(samples: Sequence[Sample]) -> bool:
    """Whether the vote over raw texts' values differs from the vote over answers."""
    return (majority([extract_answer(raw) for _, raw in samples])
            != majority([answer for answer, _ in samples]))


def trace_samples(trace: dict) -> list[Sample]:
    """Each generated sample of a trace: (its answer's value, its raw text)."""
    samples = []
    for event in trace.get("events", []):
        for comp in event.get("completions") or []:
            raw = comp["text"]
            if comp.get("reasoning") is not None:
                raw = f"<think>{comp['reasoning']}</think>{comp['text']}"
            samples.append((extract_answer(comp["text"]), raw))
    return samples


def main(runs: Sequence[str]) -> None:
    for run in runs:
        lines = (Path(run) / "traces.jsonl").read_text().splitlines()
        traces = [json.loads(line) for line in lines if line.strip()]
        differ = sum(vote_differs(trace_samples(t)) for t in traces)
        print(f"{run}: {differ}/{len(traces)} problems "
              f"({differ / max(1, len(traces)):.1%}) would vote differently on thought+answer")


if __name__ == "__main__":
    main(sys.argv[1:])
