"""Constructed eval runs (results.jsonl + traces.jsonl) for the selection-rule tests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Attempt, Completion, Message, TaskRecord
from refinery.strategies.cot import INSTRUCTION


def comp(text: str, finish: str = "stop") -> Completion:
    return Completion(text=text, prompt_tokens=10, completion_tokens=len(text.split()) or 1,
                      finish_reason=finish)


def gen(eid: str, step: str, texts: list[str] | str, *, parents: list[str] | None = None,
        strategy: str = "cot", finish: list[str] | str = "stop",
        question: str | None = None) -> TraceEvent:
    texts = [texts] if isinstance(texts, str) else texts
    fins = [finish] * len(texts) if isinstance(finish, str) else finish
    msgs = ([Message(role="user", content=f"{question}\n\n{INSTRUCTION}")]
            if question else None)
    return TraceEvent(id=eid, kind="generation", step=step, strategy=strategy,
                      parents=parents or [], messages=msgs,
                      completions=[comp(t, f) for t, f in zip(texts, fins, strict=True)])


def step(eid: str, kind: str, parents: list[str], text: str = "", strategy: str = "") -> TraceEvent:
    return TraceEvent(id=eid, kind="step", step=kind, strategy=strategy, parents=parents,
                      text=text)


@dataclass
class Problem:
    """One problem of a constructed run: its trace events and final attempt."""

    id: str
    prompt: str
    gold: str | None
    events: list[TraceEvent]
    final: str | None = None  # final attempt text
    final_events: list[str] = field(default_factory=list)
    score: float | None = None
    finish: str = "stop"
    passed: bool | None = None  # runner's verdict on the final attempt (None: derive)
    strategy: str = "critique_refine(cot)"


def write_run(root: Path, name: str, problems: list[Problem], *, with_results: bool = True,
              dataset: str = "arith", record_task: bool = False) -> Path:
    """Write a run directory as refinery.eval.runner would (config, results, traces).

    ``record_task`` writes each trace's task record (question and gold) as today's
    runner does; without it the traces look like those written before it existed.
    """
    from refinery.verifiers.math import extract_answer, is_equivalent

    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({
        "dataset": {"name": dataset, "verifier": None}, "model": DEFAULT_MODEL,
        "strategy": {"canonical": problems[0].strategy if problems else ""}}))
    with open(run / "traces.jsonl", "w") as tf, open(run / "results.jsonl", "w") as rf:
        for p in problems:
            att = None
            if p.final is not None:
                att = Attempt(text=p.final, answer=extract_answer(p.final), score=p.score,
                              finish_reason=p.finish, strategy=p.strategy.split("(")[0],
                              events=p.final_events)
            record = TaskRecord(id=p.id, question=p.prompt, gold=p.gold) if record_task else None
            trace = Trace(task_id=p.id, task=record, strategy=p.strategy, model=DEFAULT_MODEL,
                          events=p.events, attempt=att)
            tf.write(trace.model_dump_json() + "\n")
            if with_results:
                passed = p.passed
                if passed is None:
                    passed = bool(att and p.gold and is_equivalent(att.answer, p.gold))
                rf.write(json.dumps({
                    "id": p.id, "prompt": p.prompt, "gold": p.gold, "passed": passed,
                    "prediction": att.answer if att else None, "text": p.final or "",
                    "finish_reason": p.finish, "dataset": dataset, "level": 1,
                    "strategy": p.strategy, "model": DEFAULT_MODEL}) + "\n")
    if not with_results:
        (run / "results.jsonl").unlink()
    return run
