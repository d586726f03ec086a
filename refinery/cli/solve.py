"""``refinery generate | solve | graph | strategies | model-path | trace``: one question.

The sampling flags are ``SamplingParams``' fields and the budget flags the ones
``refinery eval run`` takes (``--max-calls``, ``--max-problem-tokens``), each
with its bounds; ``generate`` samples greedily by default.

Example:
    $ refinery solve "What is 17 * 23?" --strategy "sc(cot, n=4)" --max-problem-tokens 4000
"""

from __future__ import annotations

import sys

import click

from refinery.cli.console import USAGE, fail, run_or_fail
from refinery.cli.flags import field_option
from refinery.cli.options import backend_options
from refinery.engine.backends.factory import BackendKind, BackendSpec, make_backend
from refinery.engine.errors import RefineryError
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.types import SamplingParams
from refinery.eval import EvalConfig

__all__ = ["COMMANDS"]


def _spec(model: str, backend: str, base_url: tuple[str, ...], dtype: str) -> BackendSpec:
    return BackendSpec(model, BackendKind(backend), tuple(base_url), dtype=dtype)


@click.command("model-path")
@click.argument("model", default=DEFAULT_MODEL)
def model_path(model: str) -> None:
    """Resolve MODEL (converting or building a registered model on first use); print its path."""
    from refinery.engine.models import BUILT_MODELS, resolve_model

    try:
        if model in BUILT_MODELS:  # built by the trainer, a layer the engine cannot import
            from refinery.distill.think_model import ensure_think_model

            click.echo(ensure_think_model(BUILT_MODELS[model]))
            return
        click.echo(resolve_model(model))
    except RefineryError as exc:
        fail(exc)


@click.command()
@click.argument("prompt")
@backend_options
@field_option(SamplingParams, "max_tokens", default=256)
@field_option(SamplingParams, "temperature", default=0.0)
@field_option(SamplingParams, "n")
@click.option("--stream", is_flag=True, help="print tokens as they arrive")
def generate(prompt: str, model: str, backend: str, base_url: tuple[str, ...], dtype: str,
             max_tokens: int, temperature: float, n: int, stream: bool) -> None:
    """Print a completion of PROMPT from the model (no strategy)."""
    from refinery.engine.types import Message

    async def main() -> None:
        be = await make_backend(_spec(model, backend, base_url, dtype))
        try:
            msgs = [Message(role="user", content=prompt)]
            params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
            if stream:
                async for d in be.stream(msgs, params):
                    sys.stdout.write(d.text)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                return
            for i, c in enumerate(await be.generate(msgs, params, n=n)):
                if n > 1:
                    click.secho(f"--- sample {i} ({c.finish_reason}, "
                                f"{c.completion_tokens} tokens)", fg="cyan")
                click.echo(c.text)
        finally:
            await be.aclose()

    run_or_fail(main())


@click.command()
@click.argument("question")
@click.option("--strategy", "-s", default="cot", show_default=True, help="strategy spec")
@backend_options
@click.option("--trace", type=click.Path(dir_okay=False),
              help="append the task's trace (JSONL) to this file")
@field_option(SamplingParams, "max_tokens")
@field_option(SamplingParams, "temperature")
@field_option(EvalConfig, "max_calls")
@field_option(EvalConfig, "max_problem_tokens")
@field_option(EvalConfig, "max_seconds")
@field_option(EvalConfig, "loop_policy")
def solve(question: str, strategy: str, model: str, backend: str, base_url: tuple[str, ...],
          dtype: str, trace: str | None, max_tokens: int, temperature: float,
          max_calls: int | None, max_problem_tokens: int | None, max_seconds: float | None,
          loop_policy: str) -> None:
    """Solve QUESTION with a strategy; print the answer and a one-line summary."""
    from refinery.engine.context import Budget
    from refinery.engine.loops import CusumLoopDetector
    from refinery.engine.run import solve_one
    from refinery.engine.trace import TraceWriter
    from refinery.engine.types import Task
    from refinery.strategies import build_with_graph
    from refinery.strategies.spec import to_spec

    async def main() -> None:
        strat, graph = build_with_graph(strategy)
        be = await make_backend(_spec(model, backend, base_url, dtype))
        try:
            result = await solve_one(
                strat, Task.from_prompt(question), be, spec=to_spec(graph),
                params=SamplingParams(temperature=temperature, max_tokens=max_tokens),
                budget=Budget(max_calls=max_calls, max_tokens=max_problem_tokens,
                              max_seconds=max_seconds),
                loop_detector=CusumLoopDetector(), loop_policy=loop_policy)
        finally:
            await be.aclose()
        if trace:
            TraceWriter(trace).write_sync(result)
        if result.attempt is None:
            fail(result.error or "no answer")
        click.echo(result.attempt.text)
        click.secho(f"answer: {result.attempt.answer}", bold=True)
        u = result.usage
        click.secho(f"[{to_spec(graph)}] calls={u.calls} prompt_tokens={u.prompt_tokens} "
                    f"completion_tokens={u.completion_tokens} seconds={result.seconds:.1f}",
                    fg="cyan", err=True)

    run_or_fail(main())


@click.command()
@click.argument("spec")
@click.option("--max-calls", type=click.IntRange(min=1), default=2000, show_default=True,
              help="refuse specs whose worst case is above this many calls")
def graph(spec: str, max_calls: int) -> None:
    """Validate SPEC, print it as mermaid text and its worst-case call count."""
    from refinery.strategies import build_with_graph
    from refinery.strategies.spec import to_mermaid, to_spec, worst_case_calls

    try:
        _, g = build_with_graph(spec, max_calls=max_calls)
    except RefineryError as exc:
        fail(exc)
    click.echo(to_mermaid(g))
    click.echo(f"%% spec: {to_spec(g)}")
    click.echo(f"%% worst-case calls: {worst_case_calls(g)}")


@click.command("strategies")
def list_strategies() -> None:
    """List the strategies with their parameters and defaults."""
    from refinery.strategies import describe

    for entry in describe():
        alias = f" (aliases: {', '.join(entry['aliases'])})" if entry["aliases"] else ""
        inner = f" inner={entry['inner']}" if entry["inner"] not in (0, "0") else ""
        click.secho(f"{entry['name']}{alias}{inner}", bold=True)
        click.echo(f"  {entry['doc']}")
        if not entry["tool_turns"]:
            click.echo("  (a turn that may answer with a tool call runs as its inner strategy)")
        for name, p in entry["params"].items():
            click.echo(f"  {name}: {p['type']} = {p['default']!r}  {p['description']}")


@click.group("trace")
def trace_group() -> None:
    """Inspect trace files."""


@trace_group.command("show")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--task", help="only this task id")
@click.option("--width", type=click.IntRange(min=1), default=120, show_default=True)
def trace_show(path: str, task: str | None, width: int) -> None:
    """Print each task's provenance tree from a trace JSONL file."""
    from refinery.engine.trace import read_traces

    try:
        traces = read_traces(path)
    except (OSError, ValueError) as exc:
        fail(f"cannot read {path}: {exc}", USAGE)
    shown = [t for t in traces if task is None or t.task_id == task]
    if not shown:
        fail("no matching task in the file")
    for t in shown:
        click.echo(t.render(width=width))
        click.echo("")


COMMANDS = (model_path, generate, solve, graph, list_strategies, trace_group)
