"""The worker's connection to the server: handshake, jobs, pings, reconnects with backoff, drain.

One :class:`WorkerClient` serves one backend. It runs up to ``max_parallel_requests`` jobs at once,
answers pings with its free capacity (zero while the backend is unhealthy), and on SIGTERM stops
taking work, finishes what it has, then exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random

from loguru import logger
from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI

from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import (
    API_KEY_HEADER,
    CLOSE_UNSUPPORTED_PROTOCOL,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_HEADER,
    Cancel,
    Drain,
    EmbedWork,
    Hardware,
    Ping,
    Pong,
    ProtocolError,
    UpgradeRequired,
    Work,
    WorkerError,
    WorkerInfo,
    parse_server_frame,
)
from oasst_worker import metrics
from oasst_worker.backends.base import Backend, BackendError
from oasst_worker.connection.frame_sender import FrameSender
from oasst_worker.jobs.embedding import EmbeddingJob
from oasst_worker.jobs.generation import Job
from oasst_worker.prompting import PromptBuilder
from oasst_worker.settings import WorkerSettings

WORKER_VERSION = "0.1.0"


class FatalWorkerError(Exception):
    """Reconnecting cannot help (bad API key, incompatible protocol): the operator must act."""


class WorkerClient:
    def __init__(self, settings: WorkerSettings, backend: Backend, model_config: ModelConfig):
        self._settings = settings
        self._backend = backend
        self._config = model_config
        self._prompts = PromptBuilder(model_config, backend)
        self._jobs: dict[str, tuple[Job | EmbeddingJob, asyncio.Task[None]]] = {}
        self._backend_healthy = False
        self._draining = False
        self._stopped = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._sender: FrameSender | None = None

    @property
    def free_slots(self) -> int:
        if self._draining or not self._backend_healthy:
            return 0
        return max(0, self._settings.max_parallel_requests - len(self._jobs))

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Connect and serve until :meth:`drain` completes; reconnect on failures."""
        health = asyncio.create_task(self._watch_backend_health())
        try:
            await self._wait_for_backend()
            delay = self._settings.reconnect_min_delay
            while not self._stopped.is_set():
                try:
                    await self._serve_once()
                    delay = self._settings.reconnect_min_delay
                except FatalWorkerError:
                    raise
                except (OSError, ConnectionClosed, InvalidStatus, asyncio.TimeoutError) as exc:
                    if self._stopped.is_set():
                        break
                    logger.warning("connection to {} failed: {}", self._settings.server_url, _describe(exc))
                if self._stopped.is_set() or self._draining:
                    break
                sleep_for = delay * (0.5 + random.random())
                logger.info("reconnecting in {:.1f}s", sleep_for)
                await asyncio.sleep(sleep_for)
                delay = min(delay * 2, self._settings.reconnect_max_delay)
        finally:
            health.cancel()
            await self._cancel_jobs()

    async def drain(self) -> None:
        """Stop taking work, finish in-flight jobs, then stop (SIGTERM)."""
        if self._draining:
            return
        self._draining = True
        if self._ws is None:
            self._stopped.set()
            return
        logger.info("draining: finishing {} in-flight jobs, taking no new work", len(self._jobs))
        with contextlib.suppress(Exception):
            await self._send(Drain())
        while self._jobs:
            await asyncio.gather(*(t for _, t in self._jobs.values()), return_exceptions=True)
        self._stopped.set()
        if self._ws is not None:
            await self._ws.close()

    # ------------------------------------------------------------ one connection
    async def _serve_once(self) -> None:
        url = self._settings.server_url.rstrip("/") + "/workers/work"
        headers = {API_KEY_HEADER: self._settings.api_key, PROTOCOL_VERSION_HEADER: str(PROTOCOL_VERSION)}
        try:
            ws = await connect(
                url,
                additional_headers=headers,
                ping_interval=None,  # the protocol has its own pings
                open_timeout=10,
                compression=None,  # frames are tiny: deflate costs CPU per token and saves nothing
            )
        except InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                raise FatalWorkerError(
                    f"the server refused the worker API key (HTTP {exc.response.status_code})"
                ) from None
            raise
        except InvalidURI as exc:
            raise FatalWorkerError(f"invalid server URL {url!r}: {exc}") from None
        self._ws = ws
        self._sender = FrameSender(ws)
        sender_task = asyncio.create_task(self._sender.run(), name="frame-sender")
        try:
            if self._config.kind == "generation":
                await self._prompts.prepare()
            await self._send(
                WorkerInfo(
                    model_config=self._config,
                    max_parallel_requests=self._settings.max_parallel_requests,
                    backend_kind=self._settings.backend_kind,
                    worker_version=WORKER_VERSION,
                    hardware=Hardware(cpu_count=os.cpu_count()),
                )
            )
            logger.info("connected to {} serving {}", url, self._config.name)
            async for raw in ws:
                await self._handle(raw)
            self._raise_if_refused(ws)
        except ConnectionClosed:
            self._raise_if_refused(ws)
            raise
        finally:
            self._ws = None
            self._sender = None
            sender_task.cancel()
            await asyncio.gather(sender_task, return_exceptions=True)
            # The server re-queues whatever this connection held; results could not be delivered.
            await self._cancel_jobs()

    def _raise_if_refused(self, ws: ClientConnection) -> None:
        if ws.close_code == CLOSE_UNSUPPORTED_PROTOCOL:
            raise FatalWorkerError(
                f"the server refused protocol version {PROTOCOL_VERSION}: {ws.close_reason}"
            )

    async def _handle(self, raw: str | bytes) -> None:
        try:
            frame = parse_server_frame(raw)
        except ProtocolError as exc:
            logger.error("ignoring a malformed frame from the server: {}", exc)
            return
        if isinstance(frame, Ping):
            await self._send(
                Pong(ping_id=frame.ping_id, free_slots=self.free_slots, backend_healthy=self._backend_healthy)
            )
        elif isinstance(frame, (Work, EmbedWork)):
            self._start_job(frame)
        elif isinstance(frame, Cancel):
            entry = self._jobs.get(frame.message_id)
            if entry is not None:
                job, task = entry
                job.cancel_requested = True
                task.cancel()
        elif isinstance(frame, UpgradeRequired):
            raise FatalWorkerError(frame.detail)

    def _start_job(self, work: Work | EmbedWork) -> None:
        if self.free_slots <= 0 or work.message_id in self._jobs:
            reason = "worker is draining" if self._draining else "no free slot"
            self._refuse(work.message_id, reason, retryable=True)
            return
        job: Job | EmbeddingJob
        if isinstance(work, EmbedWork) != (self._config.kind == "embedding"):
            # A routing mistake of the server: this worker will never be able to do it.
            wanted = "embedding" if isinstance(work, EmbedWork) else "generation"
            error = f"worker serves the {self._config.kind} model {self._config.name}, not {wanted} work"
            self._refuse(work.message_id, error, retryable=False)
            return
        if isinstance(work, EmbedWork):
            job = EmbeddingJob(work, backend=self._backend)
        else:
            job = Job(work, backend=self._backend, prompts=self._prompts, model_config=self._config)
        task = asyncio.create_task(self._run_job(job))
        self._jobs[work.message_id] = (job, task)

    def _refuse(self, message_id: str, error: str, *, retryable: bool) -> None:
        """Answer work this worker will not run; in the background, as frames are read in order."""

        async def send() -> None:
            with contextlib.suppress(ConnectionClosed):  # the server releases the work anyway
                await self._send(WorkerError(message_id=message_id, error=error, retryable=retryable))

        asyncio.create_task(send())

    async def _run_job(self, job: Job | EmbeddingJob) -> None:
        message_id = job.work.message_id
        action = "embedding" if isinstance(job, EmbeddingJob) else "generating"
        logger.info("message {}: {} (attempt {})", message_id, action, job.work.attempt)
        try:
            await job.run(self._send)
        except ConnectionClosed:
            logger.warning("message {}: connection lost; the server will retry it", message_id)
        except Exception as exc:
            logger.opt(exception=exc).error("message {}: unexpected failure", message_id)
            with contextlib.suppress(Exception):
                await self._send(
                    WorkerError(message_id=message_id, error=f"worker error: {exc}", retryable=True)
                )
        finally:
            self._jobs.pop(message_id, None)

    async def _cancel_jobs(self) -> None:
        tasks = [t for _, t in self._jobs.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._jobs.clear()

    async def _send(self, frame: BaseModel) -> None:
        sender = self._sender
        if sender is None:
            raise ConnectionClosed(None, None)
        await sender.send(frame)

    # ------------------------------------------------------------ backend health
    async def _wait_for_backend(self) -> None:
        waited = 0.0
        while not await self._backend_ready():
            if self._stopped.is_set():
                return
            if waited == 0.0 or int(waited) % 10 == 0:
                logger.info("waiting for the backend at {}", self._settings.backend_url)
            await asyncio.sleep(1.0)
            waited += 1.0
        self._backend_healthy = True
        metrics.BACKEND_HEALTHY.set(1)

    async def _backend_ready(self) -> bool:
        try:
            return await self._backend.healthy()
        except BackendError as exc:  # e.g. an embedding model that cannot load
            if exc.retryable:
                return False
            raise FatalWorkerError(str(exc)) from None

    async def _watch_backend_health(self) -> None:
        while True:
            await asyncio.sleep(self._settings.backend_health_interval)
            healthy = await self._backend.healthy()
            if healthy != self._backend_healthy:
                logger.warning("backend is {}", "healthy again" if healthy else "unhealthy: taking no work")
            self._backend_healthy = healthy
            metrics.BACKEND_HEALTHY.set(1 if healthy else 0)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        return f"connection closed ({exc.rcvd.code if exc.rcvd else 'no close frame'})"
    return f"{type(exc).__name__}: {exc}"
