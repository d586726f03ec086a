"""Prometheus metrics of one server (its own registry, so apps never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from refinery.serving.service import Outcome, loop_alarms


class Metrics:
    """Requests, latency, tokens by strategy and model, in-flight, loop alarms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("model", "strategy")
        self.requests = Counter("refinery_requests", "Requests served, by outcome.",
                                (*labels, "endpoint", "status"), registry=self.registry)
        self.latency = Histogram("refinery_request_seconds", "Request wall time.", labels,
                                 registry=self.registry,
                                 buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900))
        self.tokens = Counter("refinery_tokens", "Tokens over all internal calls.",
                              (*labels, "kind"), registry=self.registry)
        self.calls = Counter("refinery_model_calls", "Internal model calls.", labels,
                             registry=self.registry)
        self.in_flight = Gauge("refinery_requests_in_flight", "Requests being served.",
                               registry=self.registry)
        self.loop_alarms = Counter("refinery_loop_alarms", "Generations stopped as loops.",
                                   labels, registry=self.registry)

    def observe(self, *, model: str, spec: str | None, endpoint: str, status: str,
                seconds: float, outcome: Outcome | None = None) -> None:
        """Count one finished request (with its usage, when it has an outcome)."""
        # The root strategy's name, not the whole spec: clients choose specs freely
        # (cot(instruction='...') has endless variants) and every distinct label value
        # would be a new time series kept forever.
        strategy = spec.split("(", 1)[0] if spec else "passthrough"
        labels = {"model": model, "strategy": strategy}
        self.requests.labels(**labels, endpoint=endpoint, status=status).inc()
        self.latency.labels(**labels).observe(seconds)
        if outcome is None:
            return
        usage = outcome.usage
        self.tokens.labels(**labels, kind="prompt").inc(usage.prompt_tokens)
        self.tokens.labels(**labels, kind="completion").inc(usage.completion_tokens)
        self.calls.labels(**labels).inc(usage.calls)
        self.loop_alarms.labels(**labels).inc(sum(map(loop_alarms, outcome.traces)))

    def render(self) -> bytes:
        return generate_latest(self.registry)
