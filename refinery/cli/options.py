"""Flags several commands take that no config of theirs holds: the backend, servers.

A flag a config does have comes from that config (``refinery.cli.flags``); these
describe what the commands build from them (a ``BackendSpec``, a server's
socket, its keys and Host names).

Example:
    >>> @click.command()
    ... @backend_options
    ... def generate(model: str, backend: str, base_url: tuple[str, ...], dtype: str): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from refinery.engine.backends.factory import BackendKind
from refinery.engine.models import DEFAULT_MODEL

__all__ = ["LOOPBACK", "allowed_hosts", "api_key_file_option", "backend_options", "engine_options",
           "host_option", "hosts_option", "warn_if_open"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def backend_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--model`` and the :func:`engine_options`: which model, and where it runs."""
    return click.option("--model", default=DEFAULT_MODEL, show_default=True,
                        help="registered name, local dir or hub id")(engine_options(command))


def engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--backend``, ``--base-url`` and ``--dtype``: where generations run."""
    for decorate in reversed((
        click.option("--backend", type=click.Choice([k.value for k in BackendKind]),
                     default=BackendKind.vllm.value, show_default=True,
                     help="in-process vLLM or an upstream"),
        click.option("--base-url", multiple=True,
                     help="OpenAI-compatible base URL of the upstream (repeatable)"),
        click.option("--dtype", default="auto", show_default=True,
                     help="engine dtype: auto (on CPU bfloat16 only where the CPU has "
                     "native bf16, else float32; vLLM's auto on GPU), float32, bfloat16, "
                     "float16"),
    )):
        command = decorate(command)
    return command


def host_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--host", default="127.0.0.1", show_default=True,
                        help="bind address (loopback by default)")(command)


def api_key_file_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--api-key-file", type=click.Path(exists=True, dir_okay=False),
        help="file of accepted API keys, one per line (also: REFINERY_API_KEYS, "
        "comma-separated)")(command)


def hosts_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--allowed-hosts", "hosts", multiple=True, metavar="HOSTS",
        help="names the Host header of a request to a loopback address may carry besides "
        "localhost, *.localhost, 127.0.0.1 and ::1, e.g. a reverse proxy's; any other name "
        "gets 400 untrusted_host (a web page whose DNS name was rebound to 127.0.0.1). "
        "Comma-separated or repeated; '*' accepts any. Default: REFINERY_ALLOWED_HOSTS",
    )(command)


def allowed_hosts(values: tuple[str, ...]) -> frozenset[str]:
    """``--allowed-hosts`` as ``ServerConfig.allowed_hosts``: every value split at commas,
    so both ``a,b`` and a repeated flag work as vLLM and uvicorn users write them; not
    given, ``REFINERY_ALLOWED_HOSTS``."""
    from refinery.serving.config import load_allowed_hosts

    return load_allowed_hosts(",".join(values) if values else None)


def warn_if_open(host: str, keys: frozenset[str]) -> None:
    """A server reachable from other machines without keys is worth a line on stderr."""
    if host not in LOOPBACK and not keys:
        click.secho(f"warning: serving on {host} without API keys", fg="yellow", err=True)
