"""Prometheus metrics of one server (``GET /metrics``), on a registry of its own (never the
process-wide default), so several apps in one process never clash.

What is exported (prefix ``dgemma_struct_``): the queue depth and running rows (gauges read when
scraped), requests by status and error code, latency histograms (time in the queue, constraint
compile, generation), tokens per forward, repairs, AR fallbacks, compile cache hits, remembered
compile verdicts, mode choices, readiness and draining. ``vllm:num_requests_waiting`` and
``vllm:num_requests_running`` repeat the two gauges, and ``vllm:gpu_cache_usage_perc`` the batch
utilization (running rows / ``max_batch_size``), under the names the Kubernetes inference
gateway's endpoint picker reads by default (see docs/scale_out.md).

Example::

    m = Metrics()
    m.request(200, None)
    assert b"dgemma_struct_requests_total" in m.render()[0]
"""
from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["Metrics"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TPF = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0)


class Metrics:
    """The metrics of one server; every method is thread-safe (the batch worker reports too)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        p = "dgemma_struct_"
        self.queue_depth = Gauge(p + "queue_depth", "requests waiting in the batcher's queue", registry=r)
        self.running_rows = Gauge(p + "running_rows", "rows being generated now", registry=r)
        self.waiting_alias = Gauge("vllm:num_requests_waiting", "= dgemma_struct_queue_depth (gateway name)",
                                   registry=r)
        self.running_alias = Gauge("vllm:num_requests_running", "= dgemma_struct_running_rows (gateway name)",
                                   registry=r)
        self.utilization = Gauge(p + "batch_utilization", "running rows / max_batch_size (0..1)", registry=r)
        self.utilization_alias = Gauge("vllm:gpu_cache_usage_perc", "= dgemma_struct_batch_utilization: the "
                                       "capacity signal the gateway reads as KV-cache use (0..1)", registry=r)
        self.in_flight = Gauge(p + "requests_in_flight", "HTTP requests being answered", registry=r)
        self.ready = Gauge(p + "ready", "1 when /health/ready answers 200", registry=r)
        self.draining = Gauge(p + "draining", "1 after SIGTERM (no new work is admitted)", registry=r)
        self.requests = Counter(p + "requests", "answered HTTP requests by status and error code",
                                ["status", "code"], registry=r)
        self.queue_seconds = Histogram(p + "queue_seconds", "time a row waited in the queue", buckets=_LATENCY,
                                       registry=r)
        self.compile_seconds = Histogram(p + "compile_seconds", "constraint compile time per request",
                                         buckets=_LATENCY, registry=r)
        self.generation_seconds = Histogram(p + "generation_seconds", "time a row ran (start to result)",
                                            buckets=_LATENCY, registry=r)
        self.tokens_per_forward = Histogram(p + "tokens_per_forward", "tokens committed per model forward, per row",
                                            buckets=_TPF, registry=r)
        self.tokens = Counter(p + "generated_tokens", "tokens generated", registry=r)
        self.rows = Counter(p + "rows", "finished rows by outcome", ["outcome"], registry=r)
        self.repairs = Counter(p + "repairs", "repair attempts", registry=r)
        self.fallbacks = Counter(p + "ar_fallbacks", "rows answered by the autoregressive fallback", registry=r)
        self.modes = Counter(p + "mode_choices", "rows by the mode that produced them", ["mode"], registry=r)
        self.compile_cache = Counter(p + "compile_cache", "constraint compiles by cache outcome", ["outcome"],
                                     registry=r)
        self.verdict_hits = Counter(p + "compile_verdict_hits", "requests refused at once by a remembered "
                                    "compile verdict", registry=r)
        self.warmup_seconds = Gauge(p + "warmup_seconds", "duration of the start-up warm-up generation", registry=r)

    def bind(self, queue_depth: Callable[[], float], running_rows: Callable[[], float],
             max_batch_size: int = 1) -> None:
        """Read the load gauges from the batcher whenever the endpoint is scraped."""
        def used() -> float:
            return min(1.0, running_rows() / max(1, max_batch_size))
        for g, fn in ((self.queue_depth, queue_depth), (self.waiting_alias, queue_depth),
                      (self.running_rows, running_rows), (self.running_alias, running_rows),
                      (self.utilization, used), (self.utilization_alias, used)):
            g.set_function(fn)

    def request(self, status: int, code: str | None) -> None:
        """Count one answered HTTP request."""
        self.requests.labels(status=str(status), code=code or "").inc()

    def row(self, result: Any, *, queued_s: float | None, ran_s: float | None) -> None:
        """Record one finished row: its result (a ``GenerationResult``) or its exception."""
        if queued_s is not None:
            self.queue_seconds.observe(max(0.0, queued_s))
        if ran_s is not None:
            self.generation_seconds.observe(max(0.0, ran_s))
        stats = getattr(result, "stats", None)
        if isinstance(result, BaseException):
            self.rows.labels(outcome=type(result).__name__).inc()
        else:
            self.rows.labels(outcome="ok").inc()
        if stats is None:
            return
        tpf = getattr(stats, "tokens_per_forward", 0.0) or 0.0
        if tpf > 0:
            self.tokens_per_forward.observe(tpf)
        self.tokens.inc(getattr(stats, "generated_tokens", 0) or 0)
        self.repairs.inc(getattr(stats, "repairs", 0) or 0)
        if getattr(stats, "fallback", False):
            self.fallbacks.inc()
        self.modes.labels(mode=getattr(stats, "mode", None) or "diffusion").inc()

    def render(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the Prometheus text exposition."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
