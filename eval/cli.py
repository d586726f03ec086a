"""``refinery eval``: run a strategy on a benchmark (resumable) and report runs side by side.

The lead mounts :data:`eval_app` as ``refinery eval``. A refinery error prints
one line and exits 2 when the caller asked for something wrong (bad dataset,
bad spec, a run directory holding another run), 1 when the engine or backend
failed. The first Ctrl-C drains the run (no new problem starts; the ones in
flight finish and are recorded), a second stops it at once, as SIGTERM does;
either way it exits 130 and the run resumes when rerun.

Example:
    $ refinery eval run --dataset arith --strategy "sc(cot, n=4)" --limit 50 --out runs/sc4
    $ refinery eval report runs/cot runs/sc4 --out docs --name arith
"""

from __future__ import annotations

import asyncio
import os
import signal
from enum import Enum
from typing import TYPE_CHECKING, Any

import typer
from pydantic import ValidationError

from refinery.engine.backends.factory import BackendKind
from refinery.engine.cli_options import (
    BackendOption,
    BaseUrlOption,
    DtypeOption,
    LevelsOption,
    LoopPolicyKind,
    LoopPolicyOption,
    MaxCallsOption,
    MaxTokensOption,
    ModelOption,
    ProgressOption,
    RayAddressOption,
    RayOption,
    ReplicasOption,
    TemperatureOption,
)
from refinery.engine.console import INTERRUPTED, bad_option, fail
from refinery.engine.errors import RefineryError
from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.ray_pool import RayOptions

if TYPE_CHECKING:
    from refinery.eval.runner import EvalConfig, RunSummary

__all__ = ["eval_app"]

eval_app = typer.Typer(no_args_is_help=True, add_completion=False,
                       help="Benchmarks: resumable runs, lm-eval-compatible scoring, reports.")


class SplitKind(str, Enum):
    test = "test"
    train = "train"


@eval_app.command("run")
def run_cmd(
    dataset: str = typer.Option(..., help="gsm8k | math500 | humaneval | arith | path.jsonl"),
    strategy: str = typer.Option(..., help='strategy spec, e.g. "sc(cot, n=4)"'),
    out: str = typer.Option(..., help="run directory (rerun the same command to resume)"),
    model: ModelOption = DEFAULT_MODEL,
    limit: int = typer.Option(None, min=0, help="first N problems (arith: N generated)"),
    skip: int = typer.Option(0, min=0, help="leave out the first N problems, to split a run "
                             "into shards (--skip 100 --limit 100: problems 101-200)"),
    split: SplitKind = typer.Option(SplitKind.test),
    data_path: str = typer.Option(None, help="local JSONL (file or dir) for gsm8k / math500"),
    field: list[str] = typer.Option(None, help="custom JSONL mapping, e.g. prompt=question"),
    verifier: str = typer.Option(None, help="override the dataset's verifier (math, exact...)"),
    seed: int = typer.Option(0, help="arith generator seed"),
    level: LevelsOption = None,
    concurrency: int = typer.Option(64, min=1, help="problems in flight at once (per "
                                    "engine with --ray)"),
    max_tokens: MaxTokensOption = 512,
    temperature: TemperatureOption = 0.7,
    top_p: float = typer.Option(1.0, min=0.0, max=1.0),
    max_calls: MaxCallsOption = None,
    problem_tokens: int = typer.Option(None, min=1, help="per-problem token budget"),
    max_seconds: float = typer.Option(None, min=0.001, help="per-problem time budget"),
    loop_policy: LoopPolicyOption = LoopPolicyKind.retry,
    backend: BackendOption = BackendKind.vllm,
    base_url: BaseUrlOption = None,
    force: bool = typer.Option(False, help="OUT holds another run: move it aside, start over"),
    retry_errors: bool = typer.Option(False, help="re-run problems recorded with an error"),
    progress: ProgressOption = True,
    dtype: DtypeOption = "auto",
    ray: RayOption = False,
    ray_address: RayAddressOption = None,
    replicas: ReplicasOption = 1,
    cpus_per_replica: float = typer.Option(1.0, min=0.0, help="Ray CPUs each actor holds"),
    gpus_per_replica: float = typer.Option(0.0, min=0.0, help="Ray GPUs each actor holds"),
    tensor_parallel_size: int = typer.Option(1, min=1, help="GPUs one engine spans"),
) -> None:
    """Run STRATEGY on DATASET; one result line per problem in OUT/results.jsonl.

    With --ray, whole problems go to REPLICAS Ray actors (all calls of a problem on
    one engine); this process writes every result, so a killed actor loses nothing.
    """
    # vLLM logs every engine detail; a benchmark user wants the progress bar.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from refinery.eval.datasets import parse_fields
    from refinery.eval.runner import EvalConfig

    try:
        config = EvalConfig(
            dataset=dataset, strategy=strategy, out=out, model=model, limit=limit, skip=skip,
            split=split.value, data_path=data_path, fields=parse_fields(field or None),
            verifier=verifier, seed=seed, levels=list(level) if level else None,
            temperature=temperature, top_p=top_p, max_tokens=max_tokens, max_calls=max_calls,
            max_problem_tokens=problem_tokens, max_seconds=max_seconds,
            loop_policy=loop_policy.value, concurrency=concurrency, backend=backend.value,
            base_url=list(base_url or []), dtype=dtype,
            ray=_ray_options(ray, ray_address, replicas, cpus_per_replica, gpus_per_replica,
                             tensor_parallel_size))
        summary, drained = asyncio.run(_drain_on_interrupt(
            config, force=force, retry_errors=retry_errors, progress=progress))
    except RefineryError as exc:
        fail(exc)
    except ValidationError as exc:
        bad_option(exc)
    except (KeyboardInterrupt, asyncio.CancelledError):
        fail(f"interrupted; finished problems are in {out}; rerun the same command to "
             "resume", INTERRUPTED)
    c = summary.cost
    typer.echo(f"{summary.out}: {summary.done}/{summary.total} problems "
               f"({summary.ran} run now, {summary.skipped} already done)  "
               f"accuracy {summary.accuracy}  tokens/problem {c.tokens:.0f}  "
               f"calls/problem {c.calls:.2f}  latency {c.latency_seconds:.2f}s  "
               f"this invocation {summary.seconds:.1f}s")
    if drained and summary.done < summary.total:
        fail(f"interrupted after the problems in flight; finished problems are in {out}; "
             "rerun the same command to resume", INTERRUPTED)


async def _drain_on_interrupt(config: EvalConfig, **kwargs: Any) -> tuple[RunSummary, bool]:
    """``run_eval`` with Ctrl-C as a drain; returns its summary and whether it drained.

    The first SIGINT starts no new problem and lets the ones in flight finish, so
    their work is kept; a second cancels the run (``CancelledError``), which closes
    the engine as SIGTERM does. A process started with SIGINT ignored (a background
    job) keeps it ignored.
    """
    from refinery.eval.runner import run_eval

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return await run_eval(config, **kwargs), False
    stop, loop, main = asyncio.Event(), asyncio.get_running_loop(), asyncio.current_task()

    def interrupt() -> None:
        if stop.is_set() and main is not None:
            main.cancel()
            return
        stop.set()
        typer.secho("interrupted: finishing the problems in flight (Ctrl-C again stops "
                    "now)", fg="yellow", err=True)

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await run_eval(config, stop=stop, **kwargs), stop.is_set()
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def _ray_options(on: bool, address: str | None, replicas: int, cpus: float, gpus: float,
                 tp: int) -> RayOptions | None:
    if not on:
        if address or replicas > 1:
            raise typer.BadParameter("--ray-address and --replicas need --ray")
        return None
    return RayOptions(address=address, replicas=replicas, num_cpus=cpus, num_gpus=gpus,
                      tensor_parallel_size=tp)


@eval_app.command("report")
def report_cmd(
    runs: list[str] = typer.Argument(..., help="run directories"),
    out: str = typer.Option("docs", help="directory for NAME.md and img/*.png"),
    name: str = typer.Option("report", help="file name stem of the markdown and plots"),
    title: str = typer.Option(None, help="heading of the markdown file"),
) -> None:
    """Compare runs: a markdown table (accuracy ± CI, tokens, calls, wall) and PNG plots."""
    from refinery.eval.report import write_report

    try:
        files = write_report(runs, out, name=name, title=title)
    except RefineryError as exc:
        fail(exc)
    with open(files.markdown, encoding="utf-8") as f:
        typer.echo(f.read())
    typer.echo(f"wrote {files.markdown} and {len(files.images)} plot(s): "
               + ", ".join(files.images))
