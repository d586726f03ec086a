"""What the web page needs to know about the server it is part of (or its absence)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from refinery.engine.context import Budget
from refinery.serving.config import ServerConfig, load_allowed_hosts
from refinery.strategies.spec import DEFAULT_MAX_CALLS


@dataclass(frozen=True)
class UISettings:
    """Settings of the page: keys, where eval runs are, and the served model if any.

    ``model=None`` is ``refinery ui``: runs and traces from disk, no engine, so
    the playground says where to get one. ``limits`` are the server's per-request
    caps: a playground request sends no budget, so these are the limits its
    trace is shown against. ``allowed_hosts`` and ``forwarded_allow_ips``: see
    ``ServerConfig``.

    ``draw_in_process``: trace pages are drawn in a worker process
    (:mod:`refinery.ui.drawing`), so drawing a large one does not slow the server's
    other requests; False draws them in the server's own threads (no second process,
    the other requests slowed meanwhile; ``bench/ui_load.py`` measures both).
    Settings pickle: they travel with each page the worker draws.
    """

    api_keys: frozenset[str] = frozenset()
    runs: Path | None = None
    model: str | None = None
    presets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    default_strategy: str | None = None
    max_spec_calls: int = DEFAULT_MAX_CALLS
    limits: Budget = field(default_factory=Budget)
    default_max_tokens: int = 512
    default_temperature: float = 0.7
    allowed_hosts: frozenset[str] = field(default_factory=lambda: load_allowed_hosts())
    forwarded_allow_ips: frozenset[str] = frozenset()
    draw_in_process: bool = True

    def __post_init__(self) -> None:
        # Read-only, whatever mapping was given: the settings are frozen, their presets too.
        object.__setattr__(self, "presets", MappingProxyType(dict(self.presets)))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its fields, the presets as a dict: a ``MappingProxyType`` does not
        pickle, and :meth:`__post_init__` makes it read-only again."""
        values = [getattr(self, f.name) for f in fields(self)]
        return type(self), tuple(dict(v) if isinstance(v, MappingProxyType) else v
                                 for v in values)

    @classmethod
    def of_server(cls, config: ServerConfig, runs: str | Path | None = None) -> UISettings:
        """The page of a ``refinery serve`` with ``config``: same keys, model and presets."""
        return cls(api_keys=config.api_keys, runs=Path(runs) if runs else None,
                   model=config.model, presets=config.presets,
                   default_strategy=config.default_strategy,
                   max_spec_calls=config.max_spec_calls,
                   limits=Budget(max_calls=config.max_request_calls,
                                 max_tokens=config.max_request_tokens,
                                 max_seconds=config.max_request_seconds),
                   default_max_tokens=config.default_max_tokens,
                   default_temperature=config.default_temperature,
                   allowed_hosts=config.allowed_hosts,
                   forwarded_allow_ips=config.forwarded_allow_ips)
