"""``refinery serve``: the OpenAI-compatible server, its flags ``ServerConfig``'s fields.

Every field of :class:`~refinery.serving.config.ServerConfig` with a type a flag
can spell is a flag of the same name, bounds and default (a field added there
appears here); the others are built from the flags below them: ``--effort``,
``--api-key-file``, ``--allowed-hosts``. The engine's flags (``--backend``,
``--dtype``, ``--compile``) configure the backend the server builds.

Example:
    $ refinery serve --model qwen2.5-0.5b --effort "high=sc(pot, n=8)" --api-key-file keys
"""

from __future__ import annotations

from pathlib import Path

import click

from refinery.cli.console import USAGE, fail
from refinery.cli.flags import config_flags, field_option
from refinery.cli.options import (
    allowed_hosts,
    api_key_file_option,
    engine_options,
    host_option,
    hosts_option,
    warn_if_open,
)
from refinery.engine.backends.factory import BackendKind, BackendSpec, make_backend
from refinery.engine.backends.vllm_engine import VLLMConfig
from refinery.serving import ServerConfig

__all__ = ["ENGINE_DIED_EXIT_CODE", "serve"]

ENGINE_DIED_EXIT_CODE = 3

HELP = {
    "default_strategy": "spec run for a plain model name (default: passthrough)",
    "on_engine_death": "when the in-process vLLM engine dies (its core process is gone; "
    "in-flight requests get 503 or an error chunk, /health 503): 'exit' stops the server "
    f"with status {ENGINE_DIED_EXIT_CODE} and no engine process left, for a supervisor "
    "(systemd, Kubernetes) to restart, as vLLM's own server does; 'restart' starts a new "
    "engine in this process (/health is 503 until it is ready), up to "
    "--max-engine-restarts times, then exits. An unreachable --backend openai upstream "
    "is not a death: /health is 503 until it answers again.",
    "enable_auto_tool_choice": "as vLLM's server: with --tool-call-parser, tool_choice "
    "'auto' is the model's native calls (tools through its chat template, calls parsed); "
    "with a parser but without this switch 'auto' is refused, as vLLM refuses it. Without "
    "a parser 'auto' answers in refinery's constrained envelope",
    "graceful_timeout": "on SIGTERM (or Ctrl-C): stop accepting connections, give "
    "in-flight requests this many seconds to finish, then cancel them; SIGTERM exits 0",
}


@click.command()
@config_flags(ServerConfig, leave_out=("presets", "effort", "api_keys", "allowed_hosts",
                                      "profiles"),
              help=HELP)
@host_option
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@engine_options
@click.option("--upstream-api-key", envvar="UPSTREAM_API_KEY",
              help="API key of the --backend openai upstream (also: UPSTREAM_API_KEY)")
@api_key_file_option
@click.option("--effort", multiple=True, metavar="LEVEL=SPEC",
              help="what a reasoning_effort level runs (repeatable; SPEC 'passthrough' for "
              "none); defaults: none, minimal passthrough; low cot; medium sc(cot, n=5); "
              "high sc(cot, n=16)")
@click.option("--profile", "profiles", multiple=True, default=(), metavar="DIR",
              type=click.Path(path_type=Path),
              help="a `refinery tune` profile (repeatable, one per task): reasoning_effort "
              "low/medium/high run the first one's levels, auto@MODEL its router, "
              "auto-TASK@MODEL each one's router; --effort still overrides a level")
@click.option("--compile", "compile_graph", is_flag=True,
              help="run vLLM in its torch.compile mode instead of eager: more tokens/s, a "
              "slower engine start (docs/benchmarks.md)")
@click.option("--runs", type=click.Path(file_okay=False),
              help="eval runs directory the web page (/ui) lists")
@hosts_option
@field_option(VLLMConfig, "reasoning_parser", help=(
    "vLLM's reasoning parser (e.g. deepseek_r1, qwen3): the model's thinking is split "
    "from its answer and sent as reasoning / reasoning_content"))
@field_option(VLLMConfig, "tool_call_parser", help=(
    "vLLM's tool-call parser (e.g. hermes): the model's native tool calls are parsed "
    "(with --enable-auto-tool-choice for tool_choice 'auto')"))
def serve(config: ServerConfig, host: str, port: int, backend: str,
          base_url: tuple[str, ...], dtype: str, upstream_api_key: str | None,
          api_key_file: str | None, effort: tuple[str, ...], profiles: tuple[Path, ...],
          compile_graph: bool,
          runs: str | None, hosts: tuple[str, ...], reasoning_parser: str | None,
          tool_call_parser: str | None) -> None:
    """Serve an OpenAI-compatible API with strategies selectable per request, and its
    web page at /ui (playground, eval runs, trace explorer; same API keys)."""
    import dataclasses

    from refinery.serving import create_app, load_api_keys
    from refinery.ui import mount_ui

    if config.enable_auto_tool_choice and tool_call_parser is None:
        fail("--enable-auto-tool-choice requires --tool-call-parser", USAGE)
    base, presets = _profile_settings(profiles)
    config = dataclasses.replace(config, effort=_effort_levels(effort, base),
                                 presets={**config.presets, **presets}, profiles=profiles,
                                 api_keys=load_api_keys(api_key_file),
                                 allowed_hosts=allowed_hosts(hosts))
    spec = BackendSpec(config.model, BackendKind(backend), tuple(base_url),
                       api_key=upstream_api_key, dtype=dtype, compile_graph=compile_graph,
                       reasoning_parser=reasoning_parser, tool_call_parser=tool_call_parser)
    app = mount_ui(create_app(config, backend_factory=lambda: make_backend(spec)), runs=runs)
    warn_if_open(host, config.api_keys)
    _run(app, host, port, config)


def _profile_settings(profiles: tuple[Path, ...]) -> tuple[dict, dict[str, str]]:
    """The ``--profile`` levels and presets; a bad directory fails here, at the start."""
    from refinery.engine.errors import InvalidRequestError
    from refinery.serving.config import profile_settings

    try:
        return profile_settings(list(profiles))
    except InvalidRequestError as exc:
        fail(f"--profile: {exc}", USAGE)


def _effort_levels(effort: tuple[str, ...], base: dict | None = None) -> dict:
    """The ``--effort`` levels over ``base``; a bad spec fails here, not at a request."""
    from refinery.engine.errors import SpecError
    from refinery.serving.config import effort_levels
    from refinery.strategies import build_with_graph

    try:
        levels = effort_levels(list(effort), base)
        for level in levels.values():
            if level.spec is not None:
                build_with_graph(level.spec, max_calls=None)
    except (ValueError, SpecError) as exc:
        fail(f"--effort: {exc}", USAGE)
    return levels


def _run(app, host: str, port: int, config: ServerConfig) -> None:  # noqa: ANN001
    import signal

    import uvicorn

    from refinery.serving.clients import uvicorn_proxy_options

    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level="info",
        timeout_graceful_shutdown=config.graceful_timeout,
        **uvicorn_proxy_options(config.forwarded_allow_ips)))

    def stop() -> None:
        server.should_exit = True

    app.state.stop_server = stop
    # uvicorn handles SIGTERM itself (drain, then lifespan shutdown) and afterwards
    # re-raises it under the handler that was there before; with the default one
    # that kills the process (status -15) after a clean drain. A no-op handler
    # makes a drained shutdown exit 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run()
    if app.state.engine_died:
        fail("the model engine died; exiting (--on-engine-death "
             f"{config.on_engine_death})", ENGINE_DIED_EXIT_CODE)
