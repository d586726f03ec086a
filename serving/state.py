"""The server's state: one typed object on ``app.state.server``, not closures.

Example:
    >>> state = ServerState.create(ServerConfig(), backend)  # doctest: +SKIP
    >>> with state.capacity.slot():  # doctest: +SKIP
    ...     outcome = await state.service.run(state.service.prepare(request))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import Gauge

from refinery.engine.backends.base import Backend
from refinery.engine.errors import OverCapacityError
from refinery.serving.config import ServerConfig
from refinery.serving.metrics import Metrics
from refinery.serving.service import Service
from refinery.serving.store import ResponseStore


class Capacity:
    """At most ``limit`` requests in flight; one more is refused with a 429.

    A streamed request holds its slot until its stream ends, so the limit
    bounds the strategy runs going on, not only the responses being built.
    """

    def __init__(self, limit: int, gauge: Gauge):
        self.limit = limit
        self.gauge = gauge
        self.in_flight = 0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one slot for the body of the ``with``.

        Raises:
            OverCapacityError: every slot is taken.
        """
        if self.in_flight >= self.limit:
            raise OverCapacityError(f"server is at capacity ({self.limit} requests in "
                                    "flight); retry later")
        self.in_flight += 1
        self.gauge.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.gauge.dec()


@dataclass
class ServerState:
    """Everything the routes share: settings, the service, metrics, capacity and the
    response store (None: the server stores nothing)."""

    config: ServerConfig
    service: Service
    metrics: Metrics
    capacity: Capacity
    store: ResponseStore | None = None

    @classmethod
    def create(cls, config: ServerConfig, backend: Backend | None = None) -> ServerState:
        metrics = Metrics()
        return cls(config=config, service=Service(config, backend), metrics=metrics,
                   capacity=Capacity(config.max_concurrent_requests, metrics.in_flight),
                   store=None if config.store is None else ResponseStore(
                       config.store, config.store_ttl_seconds))
