"""The server's Prometheus metrics (``GET /metrics``, through ``prometheus-client``), each in the
app's own registry: latency histograms (time to first token, inter-token latency, end to end),
request and token counters (prompt, cached, generated; the prefix-cache hit rate is cached over
prompt tokens), speculative drafts (proposed and accepted), and gauges read at scrape time (running
and waiting requests, KV pages in use, the compiled forward's variants and compile seconds)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from ..language_model import LanguageModel

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PREFIX = "smile_llm"


class ServerMetrics:
    """The metrics of one app; ``state.model`` (its serving loop and pool) is read at scrape time
    (0 while no model is loaded)."""

    def __init__(self, state: Any) -> None:
        self.registry, self.state = CollectorRegistry(), state
        self.mirrors: list[MetricsMirror] = []
        # the counters' totals, for the rates (a Counter keeps its value to itself)
        self.totals = {"prompt": 0.0, "cached": 0.0, "proposed": 0.0, "accepted": 0.0}
        r = self.registry
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Time between streamed tokens", buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds", "Request latency, end to end",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter(f"{PREFIX}_requests", "Requests answered, by status",
                                ["status"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens", registry=r)
        self.cached_tokens = Counter(f"{PREFIX}_cached_prompt_tokens",
                                     "Prompt tokens found in the prefix cache", registry=r)
        self.generated_tokens = Counter(f"{PREFIX}_generation_tokens", "Generated tokens",
                                        registry=r)
        self.proposed = Counter(f"{PREFIX}_spec_decode_proposed_tokens", "Drafts proposed",
                                registry=r)
        self.accepted = Counter(f"{PREFIX}_spec_decode_accepted_tokens", "Drafts accepted",
                                registry=r)
        Gauge(f"{PREFIX}_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache over "
              "prompt tokens, since the start", registry=r).set_function(
            lambda: _ratio(self.totals["cached"], self.totals["prompt"]))
        Gauge(f"{PREFIX}_spec_decode_acceptance_rate", "Drafts accepted over drafts proposed, "
              "since the start", registry=r).set_function(
            lambda: _ratio(self.totals["accepted"], self.totals["proposed"]))
        helps = {"num_requests_running": "Requests bound in the pool",
                 "num_requests_waiting": "Requests queued",
                 "kv_cache_pages_used": "KV pages in use",
                 "kv_cache_pages": "KV pages in all",
                 "compile_seconds": "Seconds the model's forwards spent compiling their variants",
                 "compiled_variants": "Compiled variants of the model's layers"}
        for name, read in GAUGES.items():
            Gauge(f"{PREFIX}_{name}", helps[name], registry=r).set_function(
                _reader(state, read))

    def answered(self, status: str) -> None:
        """Book one answer with HTTP ``status``."""
        self.requests.labels(status).inc()
        for mirror in self.mirrors:
            mirror.answered(status)

    def sent(self, tokens: int) -> None:
        """Book ``tokens`` generated tokens sent to a client (streamed as they go out, so a
        stream the client leaves counts what it got; a whole response when it is answered)."""
        if tokens > 0:
            self.generated_tokens.inc(tokens)
            for mirror in self.mirrors:
                mirror.sent(tokens)

    def booked(self, generation: Any) -> None:
        """Book the samples of ``generation`` (a ``Generation``) that completed: ``completed``
        for each, with its own latencies (a failed sample's are not booked)."""
        for i, handle in enumerate(generation.handles):
            if handle.done() and handle.exception(0) is None:
                self.completed(handle.result(0).stats, time.perf_counter() - generation.t0,
                               *generation.latencies(i))

    def completed(self, stats: dict[str, Any], seconds: float, ttft: float | None = None,
                  gaps: Sequence[float] = ()) -> None:
        """Book one finished generation: its ``Completion``'s stats (prompt, cached and draft
        counts; its generated tokens are booked by ``sent``), its end-to-end ``seconds``, its
        time to first token and the gaps between its tokens."""
        if ttft is not None:
            self.ttft.observe(ttft)
        for gap in gaps:
            self.itl.observe(gap)
        self.e2e.observe(seconds)
        self.prompt_tokens.inc(stats.get("prompt_tokens", 0))
        self.cached_tokens.inc(stats.get("cached_tokens", 0))
        self.proposed.inc(stats.get("proposed_drafts", 0))
        self.accepted.inc(stats.get("accepted_drafts", 0))
        for key, stat in (("prompt", "prompt_tokens"), ("cached", "cached_tokens"),
                          ("proposed", "proposed_drafts"), ("accepted", "accepted_drafts")):
            self.totals[key] += float(stats.get(stat, 0))
        for mirror in self.mirrors:
            mirror.completed(stats, seconds, ttft, gaps)

    def gauges(self) -> dict[str, float]:
        """The gauges' values now, by name (without the prefix)."""
        return {name: _of(self.state, read) for name, read in GAUGES.items()}


GAUGES: dict[str, Callable[[LanguageModel], float]] = {
    "num_requests_running": lambda m: m.serving_loop.num_running,
    "num_requests_waiting": lambda m: m.serving_loop.num_waiting,
    "kv_cache_pages_used": lambda m: _pages(m) - m.pool.free_pages,
    "kv_cache_pages": lambda m: _pages(m),
    "compile_seconds": lambda m: _compile_stat(m, "compile_seconds"),
    "compiled_variants": lambda m: _compile_stat(m, "compiled_variants"),
}


def _compile_stat(model: LanguageModel, name: str) -> float:
    """``model.compile_stats[name]`` (0 for a model that has none)."""
    return float(getattr(model, "compile_stats", {}).get(name, 0))


class MetricsMirror(Protocol):
    """Another metrics system fed the same observations (Ray's, in a replica)."""

    def answered(self, status: str) -> None: ...

    def sent(self, tokens: int) -> None: ...

    def completed(self, stats: dict[str, Any], seconds: float, ttft: float | None,
                  gaps: Sequence[float]) -> None: ...


def _pages(model: LanguageModel) -> int:
    return int(model.pool.num_slots // model.pool.page_size)


def _reader(state: Any, read: Callable[[LanguageModel], float]) -> Callable[[], float]:
    return lambda: _of(state, read)


def _of(state: Any, read: Callable[[LanguageModel], float]) -> float:
    model = state.model
    return 0.0 if model is None else float(read(model))


def _ratio(part: float, whole: float) -> float:
    return 0.0 if whole == 0 else part / whole
