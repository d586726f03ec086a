"""Options several ``refinery`` commands take, written once.

Each alias carries its type, range and help; a command gives only its default,
so every command that takes ``--model``, ``--temperature`` or ``--ray`` spells
and checks it alike. The aliases live in the lowest layer because the commands
that share them sit in several packages above it (``refinery.cli``,
``refinery.eval.cli``, ``refinery.distill.cli``), and eval and distill may not
import the top package.

A parameter's name is its flag, so an alias serves under another name too
(``base: ModelOption`` is ``--base``).

Example:
    >>> @app.command()
    ... def solve(model: ModelOption = DEFAULT_MODEL, dtype: DtypeOption = "auto"): ...
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from refinery.engine.backends.factory import BackendKind

__all__ = ["ApiKeyFileOption", "BackendOption", "BaseUrlOption", "DtypeOption", "HostOption",
           "LevelsOption", "LoopPolicyKind", "LoopPolicyOption", "MaxCallsOption",
           "MaxTokensOption", "ModelOption", "ProgressOption", "RayAddressOption", "RayOption",
           "ReplicasOption", "TemperatureOption"]


class LoopPolicyKind(str, Enum):
    """What a CUSUM loop alarm does to the generation it fires on.

    The values are ``engine.context.LoopPolicy``'s, which the commands pass on.
    """

    off = "off"
    truncate = "truncate"
    retry = "retry"


# The model and where it runs.
ModelOption = Annotated[str, typer.Option(help="registered name, local dir or hub id")]
BackendOption = Annotated[BackendKind, typer.Option(help="in-process vLLM or an upstream")]
BaseUrlOption = Annotated[list[str] | None,
                          typer.Option(help="OpenAI-compatible base URL(s) of the upstream")]
DtypeOption = Annotated[str, typer.Option(
    help="engine dtype: auto (on CPU bfloat16 only where the CPU has native bf16, else "
         "float32; vLLM's auto on GPU), float32, bfloat16, float16")]

# How each generation is sampled and how much a problem may spend.
TemperatureOption = Annotated[float, typer.Option(min=0.0, max=2.0,
                                                  help="sampling temperature (0: greedy)")]
MaxTokensOption = Annotated[int, typer.Option(min=1, help="max new tokens per generation")]
MaxCallsOption = Annotated[int | None, typer.Option(min=1, help="model calls per problem")]
LoopPolicyOption = Annotated[LoopPolicyKind,
                             typer.Option(help="on a CUSUM loop alarm: off | truncate | retry")]

# The arith generator's difficulty levels.
LevelsOption = Annotated[list[int] | None,
                         typer.Option(help="arith levels to include (repeatable)")]

# Ray actors, for the commands that can spread problems over engines.
RayOption = Annotated[bool, typer.Option("--ray", help="solve on Ray actors, one engine each "
                                         "(pip install 'refinery[ray]')")]
RayAddressOption = Annotated[str | None, typer.Option(
    help="Ray cluster: auto | ray://HOST:10001 | HOST:6379 (default: start one on this "
         "machine)")]
ReplicasOption = Annotated[int, typer.Option(min=1, help="Ray actors (engines)")]

# Servers: where they listen and whose keys they accept.
HostOption = Annotated[str, typer.Option(help="bind address (loopback by default)")]
ApiKeyFileOption = Annotated[str | None, typer.Option(
    help="file of accepted API keys, one per line (also: REFINERY_API_KEYS, comma-separated)")]

ProgressOption = Annotated[bool, typer.Option(help="show progress bars")]
