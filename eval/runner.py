"""The resumable benchmark runner: a strategy over a dataset, one result line per problem.

A run directory holds:

- ``config.json``: the full configuration (dataset + fingerprint of the selected
  problems, strategy spec, canonical form and graph, model, sampling, budget,
  code version), written once, atomically;
- ``results.jsonl``: one line per finished problem, each written whole (a single
  ``os.write`` of a complete line with ``O_APPEND``, then ``fsync``; a write that
  fails, e.g. a full disk, raises :class:`~refinery.engine.errors.StorageError` naming the
  file and the run stops: a finished result is never dropped silently);
- ``traces.jsonl``: one engine trace per finished problem (``refinery.engine.trace.TraceWriter``).

Rerunning the same command continues where the last one stopped: a torn last
line is cut off the file, problems already in ``results.jsonl`` are skipped,
traces of unfinished problems are dropped (they run again), so every problem
ends up exactly once. A directory whose recorded configuration differs is
refused (``force=True`` moves its files aside and starts over; :mod:`.run_dir`).

A task the engine cannot serve (its backend died or is unreachable) is not
recorded: the run stops with an error and the next run retries it. Any other
failure of a strategy is recorded as that problem's ``error`` (a wrong answer).

Example:
    >>> cfg = EvalConfig(dataset="arith", strategy="sc(cot, n=4)", limit=50, out="runs/sc4")
    >>> summary = await run_eval(cfg)  # doctest: +SKIP
    >>> summary.accuracy.value, summary.cost.tokens  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from refinery.engine.backends.base import Backend
from refinery.engine.backends.factory import BackendKind, BackendSpec, make_backend
from refinery.engine.context import Budget, LoopPolicy
from refinery.engine.errors import (
    BackendUnavailableError,
    InvalidRequestError,
    RefineryError,
)
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.run import iter_run
from refinery.engine.trace import Trace, TraceWriter
from refinery.engine.types import SamplingParams
from refinery.eval.datasets import load_dataset
from refinery.eval.example import Example, Split
from refinery.eval.guarded import Guarded, build_strategy
from refinery.eval.metrics import Accuracy, CostSummary, Scorer, accuracy, cost_summary
from refinery.eval.ray_pool import RayOptions
from refinery.eval.results_file import append_line, read_results
from refinery.eval.run_dir import (
    CONFIG,
    RESULTS,
    TRACES,
    ConfigMismatchError,
    code_version,
    finished_rows,
    prepare_run_dir,
    run_record,
)
from refinery.strategies.spec import to_spec

__all__ = [
    "RESULTS",
    "TRACES",
    "CONFIG",
    "ConfigMismatchError",
    "EvalConfig",
    "RunAborted",
    "RunSummary",
    "append_line",
    "code_version",
    "read_results",
    "run_eval",
]

# Errors that say "the engine could not serve this task", not "the strategy got it wrong"
# (EngineStartError is one of them).
_INFRA_ERRORS: tuple[type[RefineryError], ...] = (BackendUnavailableError,)


class RunAborted(RefineryError):
    """The run stopped before the end (backend died, sandbox broke); rerun to resume."""


class EvalConfig(BaseModel):
    """Everything that defines a run. ``identity()`` is what must match to resume.

    Example:
        >>> EvalConfig(dataset="gsm8k", strategy="cot", limit=200, out="runs/cot").max_tokens
        512
    """

    dataset: str
    strategy: str
    out: str
    model: str = DEFAULT_MODEL
    split: Split = "test"
    limit: int | None = Field(None, ge=0)
    skip: int = Field(0, ge=0, description="leave out the first N problems (a shard of a "
                      "longer run: skip=100, limit=100 is problems 101-200)")
    data_path: str | None = None
    fields: dict[str, str] = Field(default_factory=dict)
    verifier: str | None = None
    seed: int = 0
    levels: list[int] | None = None
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(512, ge=1)
    max_calls: int | None = Field(None, ge=1, description="per-problem call budget")
    max_problem_tokens: int | None = Field(None, ge=1, description="per-problem token budget")
    max_seconds: float | None = Field(None, gt=0, description="per-problem time budget")
    loop_policy: LoopPolicy = Field(
        "retry", description="what a CUSUM loop alarm does: off | truncate | retry (the "
        "server's default for strategies)")
    concurrency: int = Field(64, ge=1)
    backend: Literal["vllm", "openai", "vllm-server"] = "vllm"
    base_url: list[str] = Field(default_factory=list)
    reasoning_parser: str | None = Field(None, description="vLLM's reasoning parser of the "
                                         "in-process engine (deepseek_r1, qwen3): the "
                                         "model's thinking split from its answer")
    dtype: str = Field("auto", description="in-process engine dtype; auto: what the CPU "
                       "computes natively (not part of the run's identity)")
    ray: RayOptions | None = Field(None, description="solve on Ray actors, one engine each "
                                   "(not part of the run's identity)")

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              max_tokens=self.max_tokens)

    def budget(self) -> Budget:
        return Budget(max_calls=self.max_calls, max_tokens=self.max_problem_tokens,
                      max_seconds=self.max_seconds)

    def identity(self, canonical_spec: str, fingerprint: str, n_problems: int) -> dict[str, Any]:
        """The settings a resumed run must share (not: concurrency, backend, URLs, paths)."""
        # ``skip`` only when set, so run directories made before it existed still resume.
        shard = {"skip": self.skip} if self.skip else {}
        shard |= {"reasoning_parser": self.reasoning_parser} if self.reasoning_parser else {}
        return shard | {
            "dataset": self.dataset, "split": self.split, "limit": self.limit,
            "fields": dict(sorted(self.fields.items())), "verifier": self.verifier,
            "seed": self.seed, "levels": self.levels, "strategy": canonical_spec,
            "model": self.model, "sampling": self.sampling().model_dump(),
            "budget": self.budget().model_dump(), "loop_policy": self.loop_policy,
            "n_problems": n_problems,
            "fingerprint": fingerprint,
        }


class RunSummary(BaseModel):
    """What one call of :func:`run_eval` did, and where the run stands."""

    out: str
    total: int
    done: int
    ran: int
    skipped: int
    accuracy: Accuracy
    cost: CostSummary
    seconds: float


# ------------------------------------------------------------------------------ helpers


def backend_spec(config: EvalConfig) -> BackendSpec:
    """The backend a config names: in-process vLLM, or an OpenAI-compatible server."""
    return BackendSpec(config.model, BackendKind(config.backend), tuple(config.base_url),
                       max_concurrency=config.concurrency, dtype=config.dtype,
                       reasoning_parser=config.reasoning_parser)


def _result_row(ex: Example, index: int, trace: Trace, score: Any, *, spec: str, model: str,
                session: str, session_start: float) -> dict[str, Any]:
    att = trace.attempt
    u = trace.usage
    return {
        "id": ex.id, "index": index, "dataset": ex.dataset, "level": ex.level,
        "prompt": ex.prompt, "gold": ex.gold,
        "prediction": score.prediction, "text": att.text if att else "",
        "passed": score.passed, "score": score.score,
        "strict_match": score.strict_match, "flexible_match": score.flexible_match,
        "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                  "total_tokens": u.total_tokens, "calls": u.calls},
        "seconds": round(trace.seconds, 4),
        "finish_reason": att.finish_reason if att else None,
        "error": trace.error, "verdict": score.detail,
        "strategy": spec, "model": model,
        "session": session, "session_start": session_start, "time": time.time(),
    }


def _progress(enabled: bool, total: int, done: int) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled,
                    transient=False)
    return prog


@contextlib.asynccontextmanager
async def _traces(config: EvalConfig, strategy: Any, canonical: str, todo: Sequence[Example],
                  backend: Backend | None, writer: TraceWriter,
                  stop: asyncio.Event | None = None) -> AsyncIterator[Any]:
    """The traces of ``todo`` as they finish: on Ray actors (``config.ray``), or on
    ``backend`` (default: the one the config names, started here, closed after);
    once ``stop`` is set, only those of the problems already started."""
    tasks, golds = [e.to_task() for e in todo], {e.id: e.gold for e in todo}
    if config.ray is not None:
        if backend is not None:
            raise InvalidRequestError("a run on Ray starts its own engines; pass no backend")
        from refinery.eval.ray_pool import Work, iter_ray_run

        work = Work(canonical, backend_spec(config), config.sampling(), config.budget(),
                    config.loop_policy)
        stream = iter_ray_run(config.ray, work, tasks, concurrency=config.concurrency,
                              trace_writer=writer, golds=golds, stop=stop)
    else:
        own = backend is None
        backend = backend or await make_backend(backend_spec(config))
        stream = iter_run(Guarded(strategy), tasks, backend, concurrency=config.concurrency,
                          trace_writer=writer, spec=canonical, params=config.sampling(),
                          golds=golds, budget=config.budget(),
                          loop_detector=CusumLoopDetector(),  # unused when "off"
                          loop_policy=config.loop_policy, stop=stop)
    try:
        yield stream
    finally:
        await stream.aclose()
        if config.ray is None and own:
            await backend.aclose()


# ---------------------------------------------------------------------------------- run


async def run_eval(config: EvalConfig, *, backend: Backend | None = None,
                   examples: Sequence[Example] | None = None, force: bool = False,
                   retry_errors: bool = False, progress: bool = True,
                   on_result: Callable[[dict[str, Any]], None] | None = None,
                   stop: asyncio.Event | None = None) -> RunSummary:
    """Run (or resume) ``config``; return where the run stands.

    ``backend`` defaults to the one the config names (started here and closed at the
    end); ``examples`` overrides the dataset (tests). ``retry_errors`` re-runs
    problems recorded with an error (their old lines are removed first, atomically).
    Setting ``stop`` drains the run: no new problem starts, the ones in flight
    finish and are recorded, and the summary counts what is done (rerun to resume).

    Raises:
        DatasetError, SpecError, BudgetError: bad dataset or strategy (before any model work).
        ConfigMismatchError: ``config.out`` holds a different run and ``force`` is off.
        RunAborted: the backend died part-way (finished problems are kept; rerun to resume).
    """
    t0 = time.monotonic()
    strategy, graph = build_strategy(config.strategy)
    canonical = to_spec(graph)
    examples = _examples(config, examples)
    out = Path(config.out)
    prepare_run_dir(out, run_record(config, canonical, graph, examples), force)
    current = finished_rows(out, examples, retry_errors)
    done = {r["id"] for r in current}
    todo = [e for e in examples if e.id not in done]
    if todo:
        run = _Session(config, canonical, examples, current, progress, on_result)
        async with _traces(config, strategy, canonical, todo, backend,
                           TraceWriter(out / TRACES), stop) as stream:
            await run.consume(stream, out / RESULTS)
    return RunSummary(out=str(out), total=len(examples), done=len(current),
                      ran=len(current) - len(done), skipped=len(done),
                      accuracy=accuracy(r["passed"] for r in current),
                      cost=cost_summary(current), seconds=time.monotonic() - t0)


def _examples(config: EvalConfig, given: Sequence[Example] | None) -> list[Example]:
    """The run's problems: ``given`` or the configured dataset, cut to
    ``[skip:skip + limit]`` (a loader's ``limit`` is a prefix); ids checked unique."""
    end = None if config.limit is None else config.skip + config.limit
    if given is None:
        given = load_dataset(
            config.dataset, split=config.split, limit=end, data_path=config.data_path,
            fields=config.fields or None, verifier=config.verifier, seed=config.seed,
            levels=config.levels)
    examples = list(given)[config.skip:end]
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise InvalidRequestError("the dataset has duplicate problem ids")
    return examples


class _Session:
    """One sitting of a run: scores each trace as it arrives and appends its row.

    ``current`` (the rows so far) grows in place, so the caller's summary sees
    every row written before an abort.
    """

    def __init__(self, config: EvalConfig, canonical: str, examples: list[Example],
                 current: list[dict[str, Any]], progress: bool,
                 on_result: Callable[[dict[str, Any]], None] | None) -> None:
        self.config, self.canonical, self.current = config, canonical, current
        self.by_id = {e.id: e for e in examples}
        self.index = {e.id: i for i, e in enumerate(examples)}
        self.progress, self.on_result = progress, on_result
        self.session, self.start = uuid.uuid4().hex[:12], time.time()

    async def consume(self, stream: AsyncIterator[Trace], results_path: Path) -> None:
        scorer, total = Scorer(), len(self.by_id)
        correct = sum(1 for r in self.current if r.get("passed"))
        prog = _progress(self.progress, total, len(self.current))
        with prog:
            bar = prog.add_task(self.config.strategy, total=total, completed=len(self.current))
            async for trace in stream:
                if isinstance(trace.exception, _INFRA_ERRORS):
                    raise RunAborted(f"the backend could not serve problem {trace.task_id}: "
                                     f"{trace.error}. Finished problems are saved; rerun "
                                     "the same command to resume.")
                row = await self._row(scorer, trace)
                await asyncio.to_thread(append_line, results_path, row)
                self.current.append(row)
                correct += bool(row["passed"])
                if self.on_result is not None:
                    self.on_result(row)
                prog.update(bar, advance=1, description=(
                    f"{self.config.strategy}  acc {100 * correct / len(self.current):.1f}%"))

    async def _row(self, scorer: Scorer, trace: Trace) -> dict[str, Any]:
        ex, att = self.by_id[trace.task_id], trace.attempt
        score = await scorer.score(ex, att.text if att else "", att.answer if att else None)
        return _result_row(ex, self.index[ex.id], trace, score, spec=self.canonical,
                           model=self.config.model, session=self.session,
                           session_start=self.start)
