"""Whether the backend can take work: waited for before the first connection, then polled. While it is
unhealthy the worker reports no free slots, so the server sends it nothing.

Each poll also reads what the backend says of its capacity on its Prometheus ``/metrics``, where it
has one: requests waiting inside the backend and free KV-cache tokens. The worker reports them in its
pongs and the server's dispatcher uses them (TGI: ``tgi_queue_size``; vLLM: ``vllm:num_requests_waiting``
and the free share of ``vllm:cache_config_info``'s blocks; the bundled CPU backend: its own gauges).
A backend without the endpoint is asked once, then no more.

A pong must not report the figures of a read made before a job ended: they still count that job's KV
cache as taken, and the server would hold back the next job until the next poll (on the bundled backend,
whose free KV cache is its free slots', seconds with every slot counted busy). So a pong after a job's end
reads them again first (:meth:`BackendHealth.capacity_for_pong`). All the reads go through one HTTP client,
kept for the worker's life (:meth:`BackendHealth.close` when it stops), so they share its connection
rather than open one each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from loguru import logger
from prometheus_client.parser import text_string_to_metric_families

from oasst_worker import metrics
from oasst_worker.backends.protocols import BackendBase
from oasst_worker.backends.records import BackendError
from oasst_worker.connection.errors import FatalWorkerError

_QUEUE_METRICS = (
    "tgi_queue_size",
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "oasst_cpu_backend_queue_size",
)
PONG_READ_TIMEOUT = 0.5  # seconds a pong waits for the backend's /metrics after a job ended
POLL_READ_TIMEOUT = 2.0  # seconds a poll waits for it
_KV_FREE_METRICS = ("oasst_cpu_backend_kv_cache_free_tokens",)
_VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True)
class BackendCapacity:
    queue_length: int | None = None
    kv_cache_free_tokens: int | None = None


def parse_capacity(text: str) -> BackendCapacity:
    """The backend's queue length and free KV-cache tokens from Prometheus text (None where absent)."""
    values: dict[str, float] = {}
    labels: dict[str, dict[str, str]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values.setdefault(sample.name, 0.0)
                values[sample.name] += sample.value  # summed over labels (e.g. vLLM's model_name)
                labels.setdefault(sample.name, dict(sample.labels))
    except ValueError:
        return BackendCapacity()
    queue = next((int(values[name]) for name in _QUEUE_METRICS if name in values), None)
    kv_free = next((int(values[name]) for name in _KV_FREE_METRICS if name in values), None)
    if kv_free is None:
        usage = next((values[name] for name in _VLLM_KV_USAGE if name in values), None)
        config = labels.get("vllm:cache_config_info", {})
        try:
            total = int(config["num_gpu_blocks"]) * int(config["block_size"])
        except (KeyError, ValueError):
            total = None
        if usage is not None and total is not None:
            kv_free = max(0, int(total * (1.0 - min(1.0, max(0.0, usage)))))
    return BackendCapacity(queue, kv_free)


class BackendHealth:
    def __init__(
        self,
        backend: BackendBase,
        *,
        interval: float,
        backend_url: str,
        jobs_ended: Callable[[], int] = lambda: 0,
    ) -> None:
        self._backend = backend
        self._interval = interval
        self._backend_url = backend_url
        self.healthy = False
        self.capacity = BackendCapacity()
        self._metrics_url: str | None = backend_url.rstrip("/") + "/metrics"
        # How many of the connection's jobs had ended when the capacity figures were last read.
        self._jobs_ended = jobs_ended
        self._read_after = 0
        # Made at the first read (a backend without /metrics never needs one), closed by close().
        self._client: httpx.AsyncClient | None = None

    async def capacity_for_pong(self) -> BackendCapacity:
        """The capacity figures to report: the last read's, or a new read's if a job ended since."""
        if self._metrics_url is not None and self._jobs_ended() > self._read_after:
            # Short: the pong waits for it (a stalled /metrics reports no figures, not a late pong).
            await self._read_capacity(timeout=PONG_READ_TIMEOUT)
        return self.capacity

    async def wait_until_ready(self, stopped: asyncio.Event) -> None:
        """Until the backend answers its health check, or ``stopped`` is set."""
        waited = 0.0
        while not await self._ready():
            if stopped.is_set():
                return
            if waited == 0.0 or int(waited) % 10 == 0:
                logger.info("waiting for the backend at {}", self._backend_url)
            await asyncio.sleep(1.0)
            waited += 1.0
        self._set(True)

    async def watch(self) -> None:
        """Poll the health check for the life of the worker."""
        while True:
            await asyncio.sleep(self._interval)
            healthy = await self._backend.healthy()
            if healthy != self.healthy:
                logger.warning("backend is {}", "healthy again" if healthy else "unhealthy: taking no work")
            self._set(healthy)
            await self._read_capacity()

    async def close(self) -> None:
        """The worker stops: close the client of the /metrics reads (its connection); no read follows."""
        self._metrics_url = None
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _read_capacity(self, timeout: float = POLL_READ_TIMEOUT) -> None:
        if self._metrics_url is None:
            return
        self._read_after = self._jobs_ended()
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=POLL_READ_TIMEOUT)
        try:
            response = await self._client.get(self._metrics_url, timeout=timeout)
        except httpx.HTTPError:
            self.capacity = BackendCapacity()
            return
        if response.status_code != 200:
            if response.status_code in (404, 405):
                logger.info("the backend has no /metrics: reporting no queue or KV-cache figures")
                self._metrics_url = None
            self.capacity = BackendCapacity()
            return
        self.capacity = parse_capacity(response.text)

    def use(self, backend: BackendBase) -> None:
        """Check this backend from now on (the adapter of a model switched to)."""
        self._backend = backend

    async def check(self) -> bool:
        """One health check now (after a switch, rather than at the next poll)."""
        try:
            healthy = await self._backend.healthy()
        except Exception:
            healthy = False
        self._set(healthy)
        return healthy

    def mark_unavailable(self) -> None:
        """The backend refused a job: unhealthy until the next health check says otherwise."""
        logger.warning("backend refused work: taking no work until its health check passes")
        self._set(False)

    async def _ready(self) -> bool:
        try:
            return await self._backend.healthy()
        except BackendError as exc:  # e.g. an embedding model that cannot load
            if exc.retryable:
                return False
            raise FatalWorkerError(str(exc)) from None

    def _set(self, healthy: bool) -> None:
        self.healthy = healthy
        metrics.BACKEND_HEALTHY.set(1 if healthy else 0)
