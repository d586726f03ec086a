"""Parse rates per strategy step, from the traces of an eval run.

Every step whose output a strategy parses (SSR's decomposition, re-solves,
agreement check and 0-5 judge; the critique's rubric; DEI's reviews; SAGE's
plan; best_of_n's judge...) notes on its generation's trace event
``data["parse"] = {"step", "parsed": [bool per sample], "structured"}``
(``refinery.strategies.base.record_parse``). This script counts them: per
strategy, step and mode (structured or free text), how many samples parsed.
A run directory's ``results.jsonl`` adds the judge verifier's verdicts, whose
detail carries the same ``parsed`` / ``structured``.

    python scripts/parse_rates.py runs/ssr-arith            # a run directory
    python scripts/parse_rates.py runs/ssr-arith/traces.jsonl other/traces.jsonl
    python scripts/parse_rates.py runs/ssr-arith --json     # machine-readable

Lines that are not complete JSON (a torn last line of a killed run) are skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

Key = tuple[str, str, str]  # (strategy, step, mode)


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, skipping torn or unreadable lines."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                yield row


def _mode(structured: Any) -> str:
    return "structured" if structured else "free"


def _add(counts: dict[Key, list[int]], key: Key, parsed: Iterable[Any]) -> None:
    flags = [bool(p) for p in parsed]
    tally = counts.setdefault(key, [0, 0])
    tally[0] += sum(flags)
    tally[1] += len(flags)


def count_traces(path: Path, counts: dict[Key, list[int]]) -> None:
    """Add the parse records of every trace in ``path`` (one task per line)."""
    for trace in json_lines(path):
        for event in trace.get("events") or []:
            parse = (event.get("data") or {}).get("parse")
            if isinstance(parse, dict) and isinstance(parse.get("parsed"), list):
                key = (event.get("strategy") or "?", str(parse.get("step", "?")),
                       _mode(parse.get("structured")))
                _add(counts, key, parse["parsed"])


def count_verdicts(path: Path, counts: dict[Key, list[int]]) -> None:
    """Add the judge verifier's verdicts in a ``results.jsonl`` (rows whose verdict
    detail says which samples parsed)."""
    for row in json_lines(path):
        detail = row.get("verdict")
        if isinstance(detail, dict) and isinstance(detail.get("parsed"), list):
            _add(counts, ("verifier", "judge", _mode(detail.get("structured"))),
                 detail["parsed"])


def count(paths: Iterable[str | Path]) -> dict[Key, list[int]]:
    """``(strategy, step, mode) -> [parsed, total]`` over run directories or trace files.

    Raises:
        FileNotFoundError: a path is neither a trace file nor a directory holding one.
    """
    counts: dict[Key, list[int]] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            traces = path / "traces.jsonl"
            if not traces.is_file():
                raise FileNotFoundError(f"no traces.jsonl in {path}")
            count_traces(traces, counts)
            if (path / "results.jsonl").is_file():
                count_verdicts(path / "results.jsonl", counts)
        elif path.is_file():
            count_traces(path, counts)
        else:
            raise FileNotFoundError(f"no such run directory or trace file: {path}")
    return counts


def table(counts: dict[Key, list[int]]) -> str:
    """One line per (strategy, step, mode): parsed / total and the percentage."""
    if not counts:
        return "no parse records (no parsed step ran, or its traces predate parse records)"
    rows = [("strategy", "step", "mode", "parsed/total", "rate")]
    for (strategy, step, mode), (ok, total) in sorted(counts.items()):
        rate = f"{100 * ok / total:.1f}%" if total else "-"
        rows.append((strategy, step, mode, f"{ok}/{total}", rate))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.rjust(w) if i >= 3 else c.ljust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
                     for r in rows)


def as_json(counts: dict[Key, list[int]]) -> list[dict[str, Any]]:
    return [{"strategy": s, "step": st, "mode": m, "parsed": ok, "total": total,
             "rate": ok / total if total else None}
            for (s, st, m), (ok, total) in sorted(counts.items())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="eval run directories or trace JSONL files")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = ap.parse_args(argv)
    try:
        counts = count(args.paths)
    except FileNotFoundError as exc:
        print(f"parse_rates: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(as_json(counts), indent=1) if args.json else table(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
