"""The ``refinery`` command line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from enum import Enum
from typing import Annotated

import typer

from refinery.engine.backends.factory import BackendKind, BackendSpec, make_backend
from refinery.engine.cli_options import (
    ApiKeyFileOption,
    BackendOption,
    BaseUrlOption,
    DtypeOption,
    HostOption,
    LoopPolicyKind,
    LoopPolicyOption,
    MaxCallsOption,
    MaxTokensOption,
    ModelOption,
    TemperatureOption,
)
from refinery.engine.console import USAGE, fail, interrupt_on_sigterm
from refinery.engine.errors import RefineryError
from refinery.engine.models import DEFAULT_MODEL

# vLLM logs every engine detail to stdout; a CLI user wants the answer.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="refinery: inference-time reasoning and refinement engine.")


@app.command("model-path")
def model_path(model: str = typer.Argument(DEFAULT_MODEL)) -> None:
    """Resolve MODEL (converting the embedded model on first use) and print its path."""
    from refinery.engine.models import resolve_model

    try:
        typer.echo(resolve_model(model))
    except RefineryError as exc:
        fail(exc)


@app.command()
def generate(
    prompt: str,
    model: ModelOption = DEFAULT_MODEL,
    backend: BackendOption = BackendKind.vllm,
    base_url: BaseUrlOption = None,
    max_tokens: MaxTokensOption = 256,
    temperature: TemperatureOption = 0.0,
    n: int = typer.Option(1, min=1),
    stream: bool = typer.Option(False, help="print tokens as they arrive"),
    dtype: DtypeOption = "auto",
) -> None:
    """Print a completion of PROMPT from the model (no strategy)."""
    from refinery.engine.types import Message, SamplingParams

    async def main() -> None:
        be = await make_backend(BackendSpec(model, backend, tuple(base_url or ()),
                                            dtype=dtype))
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
                    typer.secho(f"--- sample {i} ({c.finish_reason}, "
                                f"{c.completion_tokens} tokens)", fg="cyan")
                typer.echo(c.text)
        finally:
            await be.aclose()

    try:
        asyncio.run(main())
    except RefineryError as exc:
        fail(exc)


@app.command()
def solve(
    question: str,
    strategy: str = typer.Option("cot", "--strategy", "-s", help="strategy spec"),
    model: ModelOption = DEFAULT_MODEL,
    backend: BackendOption = BackendKind.vllm,
    base_url: BaseUrlOption = None,
    trace: str = typer.Option(None, help="append the task's trace (JSONL) to this file"),
    max_tokens: MaxTokensOption = 512,
    temperature: TemperatureOption = 0.7,
    max_calls: MaxCallsOption = None,
    max_total_tokens: int = typer.Option(None, min=1, help="budget: tokens over all calls"),
    loop_policy: LoopPolicyOption = LoopPolicyKind.retry,
    dtype: DtypeOption = "auto",
) -> None:
    """Solve QUESTION with a strategy; print the answer and a one-line summary."""
    from refinery.engine.context import Budget
    from refinery.engine.loops import CusumLoopDetector
    from refinery.engine.run import solve_one
    from refinery.engine.trace import TraceWriter
    from refinery.engine.types import SamplingParams, Task
    from refinery.strategies import build_with_graph

    async def main() -> None:
        from refinery.strategies.spec import to_spec

        strat, graph = build_with_graph(strategy)
        be = await make_backend(BackendSpec(model, backend, tuple(base_url or ()),
                                            dtype=dtype))
        try:
            result = await solve_one(
                strat, Task.from_prompt(question), be, spec=to_spec(graph),
                params=SamplingParams(temperature=temperature, max_tokens=max_tokens),
                budget=Budget(max_calls=max_calls, max_tokens=max_total_tokens),
                loop_detector=CusumLoopDetector(), loop_policy=loop_policy.value)
        finally:
            await be.aclose()
        if trace:
            TraceWriter(trace).write_sync(result)
        if result.attempt is None:
            fail(result.error or "no answer")
        typer.echo(result.attempt.text)
        typer.secho(f"answer: {result.attempt.answer}", bold=True)
        u = result.usage
        typer.secho(f"[{to_spec(graph)}] calls={u.calls} prompt_tokens={u.prompt_tokens} "
                    f"completion_tokens={u.completion_tokens} seconds={result.seconds:.1f}",
                    fg="cyan", err=True)

    try:
        asyncio.run(main())
    except RefineryError as exc:
        fail(exc)


@app.command()
def graph(spec: str, max_calls: int = typer.Option(2000, help="refuse specs above this")) -> None:
    """Validate SPEC, print it as mermaid text and its worst-case call count."""
    from refinery.strategies.spec import to_mermaid, to_spec, worst_case_calls
    from refinery.strategies import build_with_graph

    try:
        _, g = build_with_graph(spec, max_calls=max_calls)
    except RefineryError as exc:
        fail(exc)
    typer.echo(to_mermaid(g))
    typer.echo(f"%% spec: {to_spec(g)}")
    typer.echo(f"%% worst-case calls: {worst_case_calls(g)}")


@app.command("strategies")
def list_strategies() -> None:
    """List the strategies with their parameters and defaults."""
    from refinery.strategies import describe

    for entry in describe():
        alias = f" (aliases: {', '.join(entry['aliases'])})" if entry["aliases"] else ""
        inner = f" inner={entry['inner']}" if entry["inner"] not in (0, "0") else ""
        typer.secho(f"{entry['name']}{alias}{inner}", bold=True)
        typer.echo(f"  {entry['doc']}")
        for name, p in entry["params"].items():
            typer.echo(f"  {name}: {p['type']} = {p['default']!r}  {p['description']}")


trace_app = typer.Typer(no_args_is_help=True, help="Inspect trace files.")
app.add_typer(trace_app, name="trace")


@trace_app.command("show")
def trace_show(path: str, task: str = typer.Option(None, help="only this task id"),
               width: int = typer.Option(120)) -> None:
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
        typer.echo(t.render(width=width))
        typer.echo("")


class EngineDeathPolicy(str, Enum):
    exit = "exit"
    restart = "restart"


ENGINE_DIED_EXIT_CODE = 3

AllowedHostsOption = Annotated[list[str] | None, typer.Option(
    "--allowed-hosts", metavar="HOSTS",
    help="names the Host header of a request to a loopback address may carry besides "
    "localhost, *.localhost, 127.0.0.1 and ::1, e.g. a reverse proxy's; any other name "
    "gets 400 untrusted_host (a web page whose DNS name was rebound to 127.0.0.1). "
    "Comma-separated or repeated; '*' accepts any. Default: REFINERY_ALLOWED_HOSTS")]


def allowed_hosts(values: list[str] | None) -> frozenset[str]:
    """``--allowed-hosts`` as ``ServerConfig.allowed_hosts``: every value split at commas,
    so both ``a,b`` and a repeated flag work as vLLM and uvicorn users write them; not
    given, ``REFINERY_ALLOWED_HOSTS``."""
    from refinery.serving.config import load_allowed_hosts

    return load_allowed_hosts(",".join(values) if values else None)


@app.command()
def serve(
    host: HostOption = "127.0.0.1",
    port: int = typer.Option(8000),
    model: ModelOption = DEFAULT_MODEL,
    backend: BackendOption = BackendKind.vllm,
    base_url: BaseUrlOption = None,
    upstream_api_key: str = typer.Option(None, envvar="UPSTREAM_API_KEY"),
    api_key_file: ApiKeyFileOption = None,
    default_strategy: str = typer.Option(None, help="spec run for a plain model name "
                                         "(default: passthrough)"),
    max_concurrent_requests: int = typer.Option(64, min=1),
    effort: list[str] = typer.Option(
        None, "--effort", metavar="LEVEL=SPEC",
        help="what a reasoning_effort level runs (repeatable; SPEC 'passthrough' for none); "
        "defaults: none, minimal passthrough; low cot; medium sc(cot, n=5); "
        "high sc(cot, n=16)"),
    on_engine_death: EngineDeathPolicy = typer.Option(
        EngineDeathPolicy.exit,
        help="when the in-process vLLM engine dies (its core process is gone; in-flight "
        "requests get 503 or an error chunk, /health 503): 'exit' stops the server with "
        f"status {ENGINE_DIED_EXIT_CODE} and no engine process left, for a supervisor "
        "(systemd, Kubernetes) to restart, as vLLM's own server does; 'restart' starts a "
        "new engine in this process (/health is 503 until it is ready), up to "
        "--max-engine-restarts times, then exits. An unreachable --backend openai "
        "upstream is not a death: /health is 503 until it answers again."),
    max_engine_restarts: int = typer.Option(3, min=0),
    graceful_timeout: float = typer.Option(
        30.0, min=0.0, help="on SIGTERM (or Ctrl-C): stop accepting connections, give "
        "in-flight requests this many seconds to finish, then cancel them; SIGTERM exits 0"),
    compile_graph: bool = typer.Option(
        False, "--compile", help="run vLLM in its torch.compile mode instead of eager: "
        "1.1-1.2x the tokens/s on CPU, but the engine starts in about 50 s instead of "
        "about 13 s (bench/compile_mode.py)"),
    dtype: DtypeOption = "auto",
    runs: str = typer.Option(None, help="eval runs directory the web page (/ui) lists"),
    hosts: AllowedHostsOption = None,
) -> None:
    """Serve an OpenAI-compatible API with strategies selectable per request, and its
    web page at /ui (playground, eval runs, trace explorer; same API keys)."""
    import signal

    import uvicorn

    from refinery.engine.errors import SpecError
    from refinery.serving import ServerConfig, create_app, load_api_keys
    from refinery.serving.config import effort_levels
    from refinery.strategies import build_with_graph
    from refinery.ui import mount_ui

    try:
        levels = effort_levels(effort)
        for level in levels.values():  # a bad spec fails here, not at a request
            if level.spec is not None:
                build_with_graph(level.spec, max_calls=None)
    except (ValueError, SpecError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--effort") from None
    config = ServerConfig(model=model, default_strategy=default_strategy, effort=levels,
                          api_keys=load_api_keys(api_key_file),
                          max_concurrent_requests=max_concurrent_requests,
                          on_engine_death=on_engine_death.value,
                          max_engine_restarts=max_engine_restarts,
                          graceful_timeout=graceful_timeout,
                          allowed_hosts=allowed_hosts(hosts))
    spec = BackendSpec(model, backend, tuple(base_url or ()), api_key=upstream_api_key,
                       dtype=dtype, compile_graph=compile_graph)
    app_ = mount_ui(create_app(config, backend_factory=lambda: make_backend(spec)), runs=runs)
    if host not in ("127.0.0.1", "localhost", "::1") and not config.api_keys:
        typer.secho(f"warning: serving on {host} without API keys", fg="yellow", err=True)
    server = uvicorn.Server(uvicorn.Config(app_, host=host, port=port, log_level="info",
                                           timeout_graceful_shutdown=graceful_timeout))

    def stop() -> None:
        server.should_exit = True

    app_.state.stop_server = stop
    # uvicorn handles SIGTERM itself (drain, then lifespan shutdown) and afterwards
    # re-raises it under the handler that was there before; with the default one
    # that kills the process (status -15) after a clean drain. A no-op handler
    # makes a drained shutdown exit 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run()
    if app_.state.engine_died:
        typer.secho("error: the model engine died; exiting (--on-engine-death "
                    f"{on_engine_death.value})", fg="red", err=True)
        raise typer.Exit(ENGINE_DIED_EXIT_CODE)


@app.command()
def ui(
    runs: str = typer.Option("runs", help="directory of eval runs (refinery eval run --out)"),
    host: HostOption = "127.0.0.1",
    port: int = typer.Option(8001),
    api_key_file: ApiKeyFileOption = None,
    hosts: AllowedHostsOption = None,
) -> None:
    """Serve the web page over eval runs and their traces, without a model (no engine)."""
    from pathlib import Path

    import uvicorn

    from refinery.serving import load_api_keys
    from refinery.ui import UISettings, create_ui_app

    if not Path(runs).is_dir():
        fail(f"no directory {runs!r} (make one with refinery eval run --out {runs}/NAME)",
             USAGE)
    keys = load_api_keys(api_key_file)
    if host not in ("127.0.0.1", "localhost", "::1") and not keys:
        typer.secho(f"warning: serving on {host} without API keys", fg="yellow", err=True)
    typer.secho(f"refinery ui: http://{host}:{port}/ui/runs", fg="cyan", err=True)
    settings = UISettings(api_keys=keys, runs=Path(runs), allowed_hosts=allowed_hosts(hosts))
    uvicorn.run(create_ui_app(settings), host=host, port=port, log_level="warning")


def _mount_subcommands() -> None:
    from refinery.verifiers.cli import check_app

    app.add_typer(check_app, name="check", help="Check an answer or a program.")
    try:
        from refinery.eval.cli import eval_app
    except ImportError:  # pragma: no cover - eval extras missing
        return
    app.add_typer(eval_app, name="eval", help="Run and report benchmark evaluations.")
    try:
        from refinery.distill.cli import distill_app
    except ImportError:  # pragma: no cover - train extras missing
        return
    app.add_typer(distill_app, name="distill", help="Traces to datasets, LoRA training, loop.")


_mount_subcommands()


def main() -> None:  # pragma: no cover - console entry point
    interrupt_on_sigterm()  # `serve` sets its own
    # refinery's own INFO lines (which dtype the engine runs, and why) on stderr;
    # libraries stay at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("refinery").setLevel(logging.INFO)
    app()


if __name__ == "__main__":
    main()
