"""Server settings: what one refinery server serves and the limits it enforces."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from refinery.engine.context import LoopPolicy
from refinery.engine.models import DEFAULT_MODEL, refinery_home

EngineDeathPolicy = Literal["exit", "restart"]

DEFAULT_PRESETS = {
    "cot": "cot",
    "sc": "sc(cot, n=8)",
    "asc": "asc(cot, max_n=16)",
    "best_of_n": "best_of_n(cot, n=4)",
    "critique_refine": "critique_refine",
    "ssr": "ssr",
    "ssr_ada": "ssr_ada",
    "ssr_plan": "ssr_plan",
    "sage": "sage(cot)",
    "dei": "dei(ssr, critique_refine, sage(cot))",
    "moa": "moa",
    "re2": "re2",
    "cot_reflection": "cot_reflection",
    "deepconf": "deepconf(cot, n=8)",
    "pot": "pot",
    "sc_pot": "sc(pot, n=8)",
    "tir": "tir",
    "beam": 'beam(scorer="arith", width=4, expand=4)',
    "dvts": 'dvts(scorer="arith", n=16, width=4)',
    "particle": 'particle(scorer="arith", n=8)',
}


@dataclass(frozen=True)
class EffortLevel:
    """What a ``reasoning_effort`` level runs: a spec (None: passthrough) and the token
    budget of the request (None: the server's cap), unless the request sets its own."""

    spec: str | None
    max_tokens: int | None = None


# OpenAI's levels, from no extra thought to the most compute a request may take here.
DEFAULT_EFFORT = {
    "none": EffortLevel(None),
    "minimal": EffortLevel(None),
    "low": EffortLevel("cot", 4_096),
    "medium": EffortLevel("sc(cot, n=5)", 16_384),
    "high": EffortLevel("sc(cot, n=16)", 65_536),
}


def effort_levels(overrides: list[str] | None = None,
                  base: dict[str, EffortLevel] | None = None) -> dict[str, EffortLevel]:
    """The default levels with ``LEVEL=SPEC`` overrides (``LEVEL=`` or
    ``LEVEL=passthrough``: no strategy); a level keeps its token budget.

    Example:
        >>> effort_levels(["high=sc(pot, n=8)"])["high"]
        EffortLevel(spec='sc(pot, n=8)', max_tokens=65536)

    Raises:
        ValueError: an item without ``=``, or a level OpenAI does not have.
    """
    levels = dict(DEFAULT_EFFORT if base is None else base)
    for item in overrides or ():
        level, sep, spec = item.partition("=")
        level, spec = level.strip(), spec.strip()
        if not sep or level not in DEFAULT_EFFORT:
            raise ValueError(f"--effort {item!r}: expected LEVEL=SPEC with LEVEL one of "
                             f"{', '.join(DEFAULT_EFFORT)}")
        levels[level] = EffortLevel(spec if spec not in ("", "passthrough") else None,
                                    DEFAULT_EFFORT[level].max_tokens)
    return levels


def profile_settings(directories: list[Path]) -> tuple[dict[str, EffortLevel], dict[str, str]]:
    """The effort levels and presets that ``refinery tune`` profiles give a server.

    ``low``/``medium``/``high`` run the first profile's level (``auto`` runs each
    candidate at its measured temperature); the preset ``auto`` is the first
    profile's router and ``auto-<task>`` each profile's router.

    Raises:
        InvalidRequestError: a directory without a profile.
    """
    from refinery.strategies.profile import Profile

    effort, presets = dict(DEFAULT_EFFORT), {}
    for k, directory in enumerate(directories):
        task = Profile.load(directory).dataset
        router = f"auto(profile={str(directory)!r})"
        presets[f"auto-{task}"] = router
        if k == 0:
            presets["auto"] = router
            for level in ("low", "medium", "high"):
                effort[level] = EffortLevel(f"auto(profile={str(directory)!r}, "
                                            f"level={level!r})",
                                            DEFAULT_EFFORT[level].max_tokens)
    return effort, presets


@dataclass
class ServerConfig:
    """Settings of one server. Limits bound what any single request may spend.

    ``default_strategy=None`` makes a plain model name a passthrough call;
    ``presets`` name specs usable as ``PRESET@MODEL`` and listed by /v1/models;
    ``effort`` maps each ``reasoning_effort`` level to what it runs (also listed
    there, on the served model's card).

    ``on_engine_death`` is what a server that built its own backend does when
    the engine dies for good (the vLLM core process is gone): ``exit`` stops
    the server with a non-zero status so a supervisor (systemd, Kubernetes)
    restarts it, which is also what vLLM's own server does; ``restart`` builds
    a new backend in place, at most ``max_engine_restarts`` times, then exits.
    ``graceful_timeout`` is how long a stopping server lets in-flight requests
    finish before cancelling them.

    ``allowed_hosts`` are the ``Host`` names a request that arrived on a loopback
    address may carry besides ``localhost``, ``*.localhost``, ``127.0.0.1`` and
    ``::1`` (a name a web page's DNS points at 127.0.0.1 is refused: DNS
    rebinding); ``*`` accepts any. Set by ``--allowed-hosts`` of ``refinery serve``
    and ``refinery ui``; by default ``REFINERY_ALLOWED_HOSTS`` (comma-separated), for
    a reverse proxy on the same machine.

    ``forwarded_allow_ips`` are the addresses whose ``X-Forwarded-For`` the server
    believes (a reverse proxy's; none by default, where uvicorn would believe
    127.0.0.1, every local program): the client address that key throttles and
    sessions are keyed by. The CLI passes ``uvicorn_proxy_options`` of it to uvicorn.

    ``store`` is the SQLite file of stored Responses and conversations (by
    default ``$REFINERY_HOME/responses.sqlite3``; None: nothing is stored, and
    ``previous_response_id`` and ``conversation`` are refused); a stored row
    expires ``store_ttl_seconds`` after it was written (OpenAI keeps responses 30
    days).

    ``enable_auto_tool_choice`` is vLLM's switch: over a backend that parses the
    model's native tool calls (its ``tool_call_parser``), ``tool_choice: "auto"``
    renders the tools through the chat template and returns the calls the parser
    finds; over such a backend without it, ``"auto"`` is refused, as vLLM's server
    refuses it. A backend without a parser always answers ``"auto"`` in the
    constrained envelope (engine/tool_calls.py).
    """

    model: str = DEFAULT_MODEL
    default_strategy: str | None = None
    presets: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PRESETS))
    effort: dict[str, EffortLevel] = field(default_factory=lambda: dict(DEFAULT_EFFORT))
    api_keys: frozenset[str] = frozenset()
    max_concurrent_requests: Annotated[int, Field(ge=1)] = 64
    max_request_tokens: int = 200_000
    max_request_calls: int = 512
    max_request_seconds: float = 900.0
    max_spec_calls: int = 2000
    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 2048
    default_max_tokens: int = 512
    default_temperature: float = 0.7
    loop_detection: bool = True
    loop_policy: LoopPolicy = "retry"
    keepalive_seconds: float = 10.0
    on_engine_death: EngineDeathPolicy = "exit"
    max_engine_restarts: Annotated[int, Field(ge=0)] = 3
    engine_check_seconds: float = 0.5
    graceful_timeout: Annotated[float, Field(ge=0)] = 30.0
    allowed_hosts: frozenset[str] = field(default_factory=lambda: load_allowed_hosts())
    forwarded_allow_ips: frozenset[str] = frozenset()
    store: Path | None = field(default_factory=lambda: refinery_home() / "responses.sqlite3")
    store_ttl_seconds: float = 30 * 24 * 3600.0
    enable_auto_tool_choice: bool = False
    profiles: tuple[Path, ...] = ()


def load_api_keys(path: str | os.PathLike[str] | None = None) -> frozenset[str]:
    """Keys from ``REFINERY_API_KEYS`` (comma-separated) and/or a file (one per line)."""
    keys = {k.strip() for k in os.environ.get("REFINERY_API_KEYS", "").split(",") if k.strip()}
    if path is not None:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        keys |= {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}
    return frozenset(keys)


def load_allowed_hosts(value: str | None = None) -> frozenset[str]:
    """Extra Host names for loopback connections: ``value``, else ``REFINERY_ALLOWED_HOSTS``
    (comma-separated, case-insensitive)."""
    text = os.environ.get("REFINERY_ALLOWED_HOSTS", "") if value is None else value
    return frozenset(h.strip().lower() for h in text.split(",") if h.strip())
