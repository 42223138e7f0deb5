"""Whether the backend can take work: waited for before the first connection, then polled. While it is
unhealthy the worker reports no free slots, so the server sends it nothing."""

from __future__ import annotations

import asyncio

from loguru import logger

from oasst_worker import metrics
from oasst_worker.backends.protocols import BackendBase
from oasst_worker.backends.records import BackendError
from oasst_worker.connection.errors import FatalWorkerError


class BackendHealth:
    def __init__(self, backend: BackendBase, *, interval: float, backend_url: str) -> None:
        self._backend = backend
        self._interval = interval
        self._backend_url = backend_url
        self.healthy = False

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
