"""RayMetrics: a replica's server metrics, mirrored into Ray's metrics (``ray.serve.metrics``),
which tag each one with the application, the deployment and the replica and export them on every
node's Prometheus endpoint (names prefixed ``ray_``). The same observations as the replica's own
``/metrics``; the gauges are copied when ``sample`` is called (each routing-stats period)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray.serve import metrics

from ..metrics import GAUGES, LATENCY_BUCKETS, PREFIX, ServerMetrics

COUNTED = {"prompt_tokens": "prompt_tokens", "cached_prompt_tokens": "cached_tokens",
           "spec_decode_proposed_tokens": "proposed_drafts",
           "spec_decode_accepted_tokens": "accepted_drafts"}


class RayMetrics:
    """The mirror of ``server`` (a ``ServerMetrics``): registers itself on it."""

    def __init__(self, server: ServerMetrics) -> None:
        self.server = server
        buckets = list(LATENCY_BUCKETS)
        self.ttft = metrics.Histogram(f"{PREFIX}_time_to_first_token_seconds",
                                      "Time to first token", boundaries=buckets)
        self.itl = metrics.Histogram(f"{PREFIX}_inter_token_latency_seconds",
                                     "Time between streamed tokens", boundaries=buckets)
        self.e2e = metrics.Histogram(f"{PREFIX}_e2e_request_latency_seconds",
                                     "Request latency, end to end", boundaries=buckets)
        self.requests = metrics.Counter(f"{PREFIX}_requests", "Requests answered, by status",
                                        tag_keys=("status",))
        self.counters = {name: metrics.Counter(f"{PREFIX}_{name}", name.replace("_", " "))
                         for name in (*COUNTED, "generation_tokens")}
        self.gauges = {name: metrics.Gauge(f"{PREFIX}_{name}", name.replace("_", " "))
                       for name in GAUGES}
        server.mirrors.append(self)

    def answered(self, status: str) -> None:
        self.requests.inc(1, tags={"status": status})

    def sent(self, tokens: int) -> None:
        self.counters["generation_tokens"].inc(tokens)

    def completed(self, stats: dict[str, Any], seconds: float, ttft: float | None,
                  gaps: Sequence[float]) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
        for gap in gaps:
            self.itl.observe(gap)
        self.e2e.observe(seconds)
        for name, stat in COUNTED.items():
            value = float(stats.get(stat, 0))
            if value > 0:
                self.counters[name].inc(value)

    def sample(self) -> None:
        """Copy the gauges' values now."""
        for name, value in self.server.gauges().items():
            self.gauges[name].set(value)
