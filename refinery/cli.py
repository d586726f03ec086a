"""The ``refinery`` command line."""

from __future__ import annotations

import asyncio
import os
import sys
from enum import Enum

import typer

from engine.errors import RefineryError

# vLLM logs every engine detail to stdout; a CLI user wants the answer.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="refinery: inference-time reasoning and refinement engine.")


class BackendKind(str, Enum):
    vllm = "vllm"
    openai = "openai"


def fail(exc: Exception) -> None:
    typer.secho(f"error: {exc}", fg="red", err=True)
    raise typer.Exit(1)


async def make_backend(model: str, backend: BackendKind, base_url: list[str] | None,
                       api_key: str | None = None):
    """Build the backend a command asked for (vLLM in-process by default)."""
    if backend == BackendKind.openai:
        from engine.backends.openai import OpenAIBackend

        if not base_url:
            raise typer.BadParameter("--backend openai needs --base-url", param_hint="--base-url")
        return OpenAIBackend(model, base_url,
                             api_key=api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"))
    from engine.backends.vllm import VLLMBackend

    return await VLLMBackend.create(model)


@app.command("model-path")
def model_path(model: str = typer.Argument("smollm2-135m")) -> None:
    """Resolve MODEL (converting the embedded model on first use) and print its path."""
    from engine.models import resolve_model

    try:
        typer.echo(resolve_model(model))
    except RefineryError as exc:
        fail(exc)


@app.command()
def generate(
    prompt: str,
    model: str = typer.Option("smollm2-135m", help="registered name, local dir or hub id"),
    backend: BackendKind = typer.Option(BackendKind.vllm),
    base_url: list[str] = typer.Option(None, help="OpenAI-compatible base URL(s)"),
    max_tokens: int = typer.Option(256, min=1),
    temperature: float = typer.Option(0.0, min=0.0, max=2.0),
    n: int = typer.Option(1, min=1),
    stream: bool = typer.Option(False, help="print tokens as they arrive"),
) -> None:
    """Print a completion of PROMPT from the model (no strategy)."""
    from engine.types import Message, SamplingParams

    async def main() -> None:
        be = await make_backend(model, backend, base_url)
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
def serve(
    host: str = typer.Option("127.0.0.1", help="bind address (loopback by default)"),
    port: int = typer.Option(8000),
    model: str = typer.Option("smollm2-135m", help="registered name, local dir or hub id"),
    backend: BackendKind = typer.Option(BackendKind.vllm),
    base_url: list[str] = typer.Option(None, help="upstream OpenAI-compatible base URL(s)"),
    upstream_api_key: str = typer.Option(None, envvar="UPSTREAM_API_KEY"),
    api_key_file: str = typer.Option(None, help="file of accepted API keys, one per line "
                                     "(also: REFINERY_API_KEYS, comma-separated)"),
    default_strategy: str = typer.Option(None, help="spec run for a plain model name "
                                         "(default: passthrough)"),
    max_concurrent_requests: int = typer.Option(64, min=1),
) -> None:
    """Serve an OpenAI-compatible API with strategies selectable per request."""
    import uvicorn

    from serving import ServerConfig, create_app, load_api_keys

    config = ServerConfig(model=model, default_strategy=default_strategy,
                          api_keys=load_api_keys(api_key_file),
                          max_concurrent_requests=max_concurrent_requests)
    app_ = create_app(config, backend_factory=lambda: make_backend(
        model, backend, base_url, upstream_api_key))
    if host not in ("127.0.0.1", "localhost", "::1") and not config.api_keys:
        typer.secho(f"warning: serving on {host} without API keys", fg="yellow", err=True)
    uvicorn.run(app_, host=host, port=port, log_level="info")


def _mount_subcommands() -> None:
    from verifiers.cli import check_app

    app.add_typer(check_app, name="check", help="Check an answer or a program.")
    try:
        from eval.cli import eval_app
    except ImportError:  # pragma: no cover - eval extras missing
        return
    app.add_typer(eval_app, name="eval", help="Run and report benchmark evaluations.")


_mount_subcommands()


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":
    app()
