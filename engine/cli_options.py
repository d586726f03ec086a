"""Options several ``refinery`` commands take, written once.

Each alias carries its type and help; a command gives only its default, so
``refinery generate``, ``solve``, ``serve`` and ``eval run`` spell ``--model``,
``--backend``, ``--base-url``, ``--dtype`` and ``--loop-policy`` alike.

Example:
    >>> @app.command()
    ... def solve(model: ModelOption = DEFAULT_MODEL, dtype: DtypeOption = "auto"): ...
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from refinery.engine.backends.factory import BackendKind

__all__ = ["BackendOption", "BaseUrlOption", "DtypeOption", "LoopPolicyKind",
           "LoopPolicyOption", "ModelOption"]


class LoopPolicyKind(str, Enum):
    """What a CUSUM loop alarm does to the generation it fires on."""

    off = "off"
    truncate = "truncate"
    retry = "retry"


ModelOption = Annotated[str, typer.Option(help="registered name, local dir or hub id")]
BackendOption = Annotated[BackendKind, typer.Option(help="in-process vLLM or an upstream")]
BaseUrlOption = Annotated[list[str] | None,
                          typer.Option(help="OpenAI-compatible base URL(s) of the upstream")]
DtypeOption = Annotated[str, typer.Option(
    help="engine dtype: auto (on CPU bfloat16 only where the CPU has native bf16, else "
         "float32; vLLM's auto on GPU), float32, bfloat16, float16")]
LoopPolicyOption = Annotated[LoopPolicyKind,
                             typer.Option(help="on a CUSUM loop alarm: off | truncate | retry")]
