"""Prometheus metrics of the worker, served on ``OASST_WORKER_METRICS_PORT`` when set."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

JOBS = Counter("oasst_worker_jobs_total", "Jobs by outcome", ["outcome"])
TOKENS = Counter("oasst_worker_tokens_generated_total", "Tokens streamed to the server")
IN_FLIGHT = Gauge("oasst_worker_in_flight_jobs", "Jobs being generated")
BACKEND_HEALTHY = Gauge("oasst_worker_backend_healthy", "1 when the backend answers its health check")
TIME_TO_FIRST_TOKEN = Histogram(
    "oasst_worker_time_to_first_token_seconds",
    "From receiving a job to the backend's first token",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
TOKENS_PER_SECOND = Histogram(
    "oasst_worker_tokens_per_second",
    "Decode speed per job, first token to last",
    buckets=(1, 5, 10, 25, 50, 100, 200, 500, 1000, 5000),
)
