"""``refinery eval``: run a strategy on a benchmark (resumable) and report runs side by side.

``eval run``'s flags are :class:`~refinery.eval.runner.EvalConfig`'s fields (and
``--ray-*`` :class:`~refinery.eval.ray_pool.RayOptions`'), names, bounds and
defaults included. A refinery error prints one line and exits 2 when the caller
asked for something wrong (bad dataset, bad spec, a run directory holding
another run), 1 when the engine or backend failed. The first Ctrl-C drains the
run (no new problem starts; the ones in flight finish and are recorded), a
second stops it at once, as SIGTERM does; either way it exits 130 and the run
resumes when rerun.

Example:
    $ refinery eval run --dataset arith --strategy "sc(cot, n=4)" --limit 50 --out runs/sc4
    $ refinery eval report runs/cot runs/sc4 --out docs --name arith
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING, Any

import click

from refinery.cli.console import INTERRUPTED, fail, missing_extra
from refinery.cli.flags import config_flags
from refinery.engine.errors import RefineryError
from refinery.eval import EvalConfig

if TYPE_CHECKING:
    from refinery.eval.runner import RunSummary

__all__ = ["RAY_HELP", "eval_group"]

# Help for the RayOptions fields, which both `eval run` and `distill loop` take.
RAY_HELP = {
    "ray": "solve on Ray actors, one engine each (pip install 'refinery[ray]')",
    "ray_address": "Ray cluster: auto | ray://HOST:10001 | HOST:6379 (default: start one "
    "on this machine)",
    "ray_replicas": "Ray actors (engines)",
    "ray_num_cpus": "Ray CPUs each actor holds",
    "ray_num_gpus": "Ray GPUs each actor holds",
    "ray_tensor_parallel_size": "GPUs one engine spans",
    "ray_env": "environment variable set in every actor (repeatable)",
}

HELP = RAY_HELP | {
    "dataset": "gsm8k | math500 | humaneval | arith | path.jsonl",
    "strategy": 'strategy spec, e.g. "sc(cot, n=4)"',
    "out": "run directory (rerun the same command to resume)",
    "model": "registered name, local dir or hub id",
    "limit": "first N problems (arith: N generated)",
    "data_path": "local JSONL (file or dir) for gsm8k / math500",
    "fields": "custom JSONL mapping, e.g. prompt=question (repeatable)",
    "verifier": "override the dataset's verifier (math, exact...)",
    "seed": "arith generator seed",
    "levels": "arith levels to include (repeatable)",
    "concurrency": "problems in flight at once (per engine with --ray)",
    "backend": "in-process vLLM or an upstream",
    "base_url": "OpenAI-compatible base URL of the upstream (repeatable)",
}


@click.group("eval")
def eval_group() -> None:
    """Benchmarks: resumable runs, lm-eval-compatible scoring, reports."""


@eval_group.command("run")
@config_flags(EvalConfig, help=HELP)
@click.option("--force", is_flag=True, help="OUT holds another run: move it aside, start over")
@click.option("--retry-errors", is_flag=True, help="re-run problems recorded with an error")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="show progress bars")
def run_cmd(config: EvalConfig, force: bool, retry_errors: bool, progress: bool) -> None:
    """Run STRATEGY on DATASET; one result line per problem in OUT/results.jsonl.

    With --ray, whole problems go to --ray-replicas Ray actors (all calls of a
    problem on one engine); this process writes every result, so a killed actor
    loses nothing.
    """
    # vLLM logs every engine detail; a benchmark user wants the progress bar.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        summary, drained = asyncio.run(_drain_on_interrupt(
            config, force=force, retry_errors=retry_errors, progress=progress))
    except RefineryError as exc:
        fail(exc)
    except ModuleNotFoundError as exc:
        missing_extra(exc)
    except (KeyboardInterrupt, asyncio.CancelledError):
        fail(f"interrupted; finished problems are in {config.out}; rerun the same command "
             "to resume", INTERRUPTED)
    c = summary.cost
    click.echo(f"{summary.out}: {summary.done}/{summary.total} problems "
               f"({summary.ran} run now, {summary.skipped} already done)  "
               f"accuracy {summary.accuracy}  tokens/problem {c.tokens:.0f}  "
               f"calls/problem {c.calls:.2f}  latency {c.latency_seconds:.2f}s  "
               f"this invocation {summary.seconds:.1f}s")
    if drained and summary.done < summary.total:
        fail(f"interrupted after the problems in flight; finished problems are in "
             f"{config.out}; rerun the same command to resume", INTERRUPTED)


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
        click.secho("interrupted: finishing the problems in flight (Ctrl-C again stops "
                    "now)", fg="yellow", err=True)

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await run_eval(config, stop=stop, **kwargs), stop.is_set()
    finally:
        loop.remove_signal_handler(signal.SIGINT)


@eval_group.command("report")
@click.argument("runs", nargs=-1, required=True)
@click.option("--out", default="docs", show_default=True,
              help="directory for NAME.md and img/*.png")
@click.option("--name", default="report", show_default=True,
              help="file name stem of the markdown and plots")
@click.option("--title", help="heading of the markdown file")
def report_cmd(runs: tuple[str, ...], out: str, name: str, title: str | None) -> None:
    """Compare RUNS: a markdown table (accuracy ± CI, tokens, calls, wall) and PNG plots."""
    from refinery.eval.report import write_report

    try:
        files = write_report(list(runs), out, name=name, title=title)
    except RefineryError as exc:
        fail(exc)
    except ModuleNotFoundError as exc:
        missing_extra(exc)
    with open(files.markdown, encoding="utf-8") as f:
        click.echo(f.read())
    click.echo(f"wrote {files.markdown} and {len(files.images)} plot(s): "
               + ", ".join(files.images))
