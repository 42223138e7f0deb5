"""Prometheus metrics of the backend, in a registry of its own (one per app, so tests can build several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class BackendMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        prefix = "oasst_cpu_backend"
        self.requests = Counter(
            f"{prefix}_requests",
            "Generation requests by outcome "
            "(success, validation_error, overloaded, cancelled, timeout, queue_timeout, error)",
            ["outcome"],
            registry=self.registry,
        )
        self.cancellations = Counter(
            f"{prefix}_cancellations",
            "Generations stopped early because the client went away",
            registry=self.registry,
        )
        self.generated_tokens = Counter(
            f"{prefix}_generated_tokens", "Tokens generated, all requests", registry=self.registry
        )
        self.prompt_tokens = Counter(
            f"{prefix}_prompt_tokens", "Prompt tokens of started generations", registry=self.registry
        )
        self.reused_prompt_tokens = Counter(
            f"{prefix}_prefix_cache_tokens",
            "Prompt tokens served from the KV cache of the previous request",
            registry=self.registry,
        )
        self.queue_size = Gauge(
            f"{prefix}_queue_size", "Requests waiting for the model", registry=self.registry
        )
        self.running = Gauge(
            f"{prefix}_running", "Requests generating right now (0 or 1)", registry=self.registry
        )
        self.max_concurrent = Gauge(
            f"{prefix}_max_concurrent_requests", "Requests admitted at most", registry=self.registry
        )
        self.time_to_first_token = Histogram(
            f"{prefix}_time_to_first_token_seconds",
            "From the request's arrival to its first generated token (queue wait included)",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            f"{prefix}_queue_wait_seconds",
            "Time a request waited for the model",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.request_duration = Histogram(
            f"{prefix}_request_duration_seconds",
            "From arrival to the end of the generation",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.time_per_output_token = Histogram(
            f"{prefix}_time_per_output_token_seconds",
            "Mean decode time per token after the first, per request",
            buckets=(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.generated_tokens_per_request = Histogram(
            f"{prefix}_request_generated_tokens",
            "Generated tokens per request",
            buckets=_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.input_length = Histogram(
            f"{prefix}_request_input_length",
            "Prompt tokens per request",
            buckets=_TOKEN_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
