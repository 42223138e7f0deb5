"""Prometheus metrics of the backend, in a registry of its own (one per app, so tests can build several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_PREFIX = "oasst_cpu_backend"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_DECODE_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0)


class BackendMetrics:
    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry()

        def counter(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{_PREFIX}_{name}", documentation, labels, registry=registry)

        def gauge(name: str, documentation: str) -> Gauge:
            return Gauge(f"{_PREFIX}_{name}", documentation, registry=registry)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"{_PREFIX}_{name}", documentation, buckets=buckets, registry=registry)

        self.requests = counter(
            "requests",
            "Generation requests by outcome "
            "(success, validation_error, overloaded, cancelled, timeout, queue_timeout, error)",
            ("outcome",),
        )
        self.cancellations = counter(
            "cancellations", "Generations stopped early because the client went away"
        )
        self.generated_tokens = counter("generated_tokens", "Tokens generated, all requests")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of started generations")
        self.reused_prompt_tokens = counter(
            "prefix_cache_tokens",
            "Prompt tokens served from the prefix cache (KV kept from earlier requests)",
        )
        self.queue_size = gauge("queue_size", "Requests waiting for the model")
        self.running = gauge("running", "Requests being decoded right now (at most slots_total)")
        self.slots_total = gauge("slots_total", "Sequences decoded together at most (parallel_sequences)")
        self.slots_busy = gauge("slots_busy", "Sequence slots running a request now")
        self.max_concurrent = gauge("max_concurrent_requests", "Requests admitted at most")
        # A new request needs a free slot; the cached prefix a free slot holds gives way to it.
        self.kv_cache_free_tokens = gauge(
            "kv_cache_free_tokens", "KV-cache tokens new requests can use (the free slots' streams)"
        )
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "From the request's arrival to its first generated token (queue wait included)",
            _LATENCY_BUCKETS,
        )
        self.queue_wait = histogram(
            "queue_wait_seconds", "Time a request waited for the model", _LATENCY_BUCKETS
        )
        self.request_duration = histogram(
            "request_duration_seconds", "From arrival to the end of the generation", _LATENCY_BUCKETS
        )
        self.time_per_output_token = histogram(
            "time_per_output_token_seconds",
            "Mean decode time per token after the first, per request",
            _DECODE_BUCKETS,
        )
        self.generated_tokens_per_request = histogram(
            "request_generated_tokens", "Generated tokens per request", _TOKEN_BUCKETS
        )
        self.input_length = histogram("request_input_length", "Prompt tokens per request", _TOKEN_BUCKETS)

    def render(self) -> bytes:
        return generate_latest(self.registry)
