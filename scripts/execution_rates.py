"""What the sandbox did in execution-strategy runs (pot, sc(pot), tir, self_debug).

For each eval run directory: accuracy with its 95% Wilson interval, tokens and
calls per problem (from ``results.jsonl``), and from ``traces.jsonl``: sandbox
runs per problem, the share that ran cleanly (printed a value; for self_debug,
passed every example the prompt shows), repair turns, how many gave a program that ran and how
many a right answer,
and for pot's programs whether their number literals come from the question (a
program that computes with other numbers cannot be right, however it runs).

    python scripts/execution_rates.py runs/pot-arith runs/tir-arith
    python scripts/execution_rates.py runs/pot-arith --json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from refinery.eval.metrics import wilson_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parse_rates import json_lines  # noqa: E402 (the scripts' one JSONL reader)

_LITERAL = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
TRIVIAL = {"0", "1", "2", "100"}  # counts, halves, percents: not taken from a question


@dataclass
class Rates:
    """One run's figures."""

    run: str
    problems: int = 0
    right: int = 0
    interval: tuple[float, float] = (0.0, 0.0)
    tokens: float = 0.0
    calls: float = 0.0
    runs: int = 0
    clean_runs: int = 0
    repairs: int = 0
    repairs_fixed: int = 0
    repaired_right: int = 0  # problems whose answer came from a repaired program, right
    programs: int = 0
    from_question: int = 0  # every literal in the question
    none_from_question: int = 0  # literals, none of them in the question
    per_problem: dict[str, int] = field(default_factory=dict, repr=False)


def lines(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file (none when it is missing)."""
    return json_lines(path) if path.is_file() else iter(())


def literals(program: str) -> set[str]:
    code = "\n".join(ln.split("#")[0] for ln in program.splitlines())
    return {x.rstrip("0").rstrip(".") if "." in x else x for x in _LITERAL.findall(code)}


def add_results(rates: Rates, run: Path) -> None:
    rows = list(lines(run / "results.jsonl"))
    rates.problems = len(rows)
    rates.right = sum(bool(r.get("passed")) for r in rows)
    rates.interval = wilson_interval(rates.right, rates.problems) if rows else (0.0, 0.0)
    usage = [r.get("usage") or {} for r in rows]
    n = max(len(rows), 1)
    rates.tokens = sum(u.get("total_tokens", 0) for u in usage) / n
    rates.calls = sum(u.get("calls", 0) for u in usage) / n


def add_trace(rates: Rates, trace: dict[str, Any], passed: bool) -> None:
    events = trace.get("events") or []
    meta = (trace.get("attempt") or {}).get("metadata") or {}
    rates.repaired_right += bool(meta.get("repaired")) and passed
    by_id = {e.get("id"): e for e in events}
    question = ((trace.get("task") or {}).get("question")) or ""
    numbers = literals(question)
    for e in events:
        if e.get("step") != "execute":
            continue
        data = e.get("data") or {}
        # pot and tir say whether the program ran; self_debug how many examples passed.
        ok = bool(data["ok"]) if "ok" in data else data.get("passed") == data.get("examples")
        rates.runs += 1
        rates.clean_runs += ok
        parent = by_id.get((e.get("parents") or [None])[0]) or {}
        if parent.get("step") == "refine":
            rates.repairs += 1
            rates.repairs_fixed += ok
        program = (e.get("text") or "").split("```")[1] if "```" in (e.get("text") or "") else ""
        used = literals(program) - TRIVIAL
        if used and e.get("strategy") == "pot":
            rates.programs += 1
            rates.from_question += used <= numbers
            rates.none_from_question += not (used & numbers)


def rates_of(run: Path) -> Rates:
    rates = Rates(run=str(run))
    add_results(rates, run)
    passed = {r.get("id"): bool(r.get("passed")) for r in lines(run / "results.jsonl")}
    for trace in lines(run / "traces.jsonl"):
        add_trace(rates, trace, passed.get(trace.get("task_id"), False))
    return rates


def show(r: Rates) -> str:
    n = max(r.problems, 1)
    lo, hi = r.interval
    out = [f"{r.run}: {r.right}/{r.problems} = {100 * r.right / n:.1f}% "
           f"({100 * lo:.1f}-{100 * hi:.1f}), {r.tokens:,.0f} tokens, {r.calls:.2f} calls",
           f"  sandbox runs {r.runs / n:.2f}/problem, clean {r.clean_runs} of {r.runs}"
           + (f" ({100 * r.clean_runs / r.runs:.0f}%)" if r.runs else ""),
           f"  repairs {r.repairs}: {r.repairs_fixed} gave a program that ran, "
           f"{r.repaired_right} a right answer"]
    if r.programs:
        out.append(f"  pot programs {r.programs}: literals all from the question "
                   f"{r.from_question} ({100 * r.from_question / r.programs:.0f}%), none "
                   f"from it {r.none_from_question} "
                   f"({100 * r.none_from_question / r.programs:.0f}%)")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="eval run directories")
    ap.add_argument("--json", action="store_true", help="one JSON object per run")
    args = ap.parse_args(argv)
    for run in args.runs:
        r = rates_of(run)
        print(json.dumps(asdict(r)) if args.json else show(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
