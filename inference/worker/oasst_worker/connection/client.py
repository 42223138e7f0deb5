"""The worker's serve loop: one connection at a time to the server, reconnects with backoff, and drain.

One :class:`WorkerClient` serves one backend through a :class:`JobFactory`. It runs up to
``max_parallel_requests`` jobs at once, answers pings with its free capacity (zero while the backend is
unhealthy, while it switches models and while it holds none), and on SIGTERM stops taking work, finishes
what it has, then exits. With a :class:`Switching` it announces the models it can switch to and switches
when the server asks (protocol 6, see :mod:`oasst_worker.connection.switching`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from loguru import logger
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oasst_shared.protocol import (
    MAX_ERROR_CHARS,
    Cancel,
    Detokenize,
    Detokenized,
    Drain,
    EmbedWork,
    LoadModel,
    ModelSwitch,
    Ping,
    Pong,
    ProtocolError,
    Tokenize,
    Tokenized,
    UnloadModel,
    UpgradeRequired,
    Work,
    WorkerError,
    parse_server_frame,
    top_level_strings,
)
from oasst_shared.token_frames import TokenFrame
from oasst_worker.connection.backend_health import BackendHealth
from oasst_worker.connection.errors import FatalWorkerError
from oasst_worker.connection.frame_sender import FrameSender, OutgoingFrame
from oasst_worker.connection.handshake import open_connection, raise_if_refused, work_url, worker_info
from oasst_worker.connection.switching import SWITCH_IN_PROGRESS, Switching
from oasst_worker.jobs.base import JobFactory, WrongKindOfWork
from oasst_worker.jobs.pool import JobPool
from oasst_worker.settings import WorkerSettings

# The frames that give the worker a job: one it cannot read is answered with an error for its message.
WORK_FRAME_TYPES = ("work", "embed")


class WorkerClient:
    def __init__(
        self,
        settings: WorkerSettings,
        jobs: JobFactory,
        *,
        name: str | None = None,
        switching: Switching | None = None,
    ):
        self._settings = settings
        self._factory = jobs
        self.name = name  # which backend this connection serves, where a worker has several
        # Switching the model on the server's request; None: this connection serves its model only.
        self.switching = switching
        self._switch_task: asyncio.Task[None] | None = None
        self._jobs = JobPool()
        self._health = BackendHealth(
            jobs.backend,
            interval=settings.backend_health_interval,
            backend_url=settings.backend_url,
            jobs_ended=lambda: self._jobs.ended,
        )
        self._draining = False
        self._stopped = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._sender: FrameSender | None = None
        self._background: set[asyncio.Task[None]] = set()  # answers being computed

    @property
    def factory(self) -> JobFactory:
        return self._factory

    @property
    def settings(self) -> WorkerSettings:
        """The settings this connection runs with (its backend_url, where a worker has several)."""
        return self._settings

    @property
    def free_slots(self) -> int:
        if self._draining or not self._health.healthy or not self.serving:
            return 0
        return max(0, self._settings.max_parallel_requests - len(self._jobs))

    @property
    def serving(self) -> bool:
        """Whether a model is loaded and no switch runs (otherwise the connection takes no work)."""
        return self.switching is None or (self.switching.loaded and not self.switching.busy)

    @property
    def loaded(self) -> bool:
        return self.switching is None or self.switching.loaded

    async def backend_lost(self, reason: str) -> None:
        """The backend process died (a managed backend): take no work until it is healthy again, and hand
        every job it held back to the server as a retryable failure, at once rather than when each job's
        stream notices."""
        self._health.mark_unavailable()
        message_ids = await self._jobs.abort_all()
        if message_ids:
            logger.warning(
                "{}: handing {} jobs back to the server: {}", self.name or "backend", len(message_ids), reason
            )
        for message_id in message_ids:
            frame = WorkerError(
                message_id=message_id,
                error=f"worker backend failed: {reason}"[:MAX_ERROR_CHARS],
                retryable=True,
            )
            with contextlib.suppress(
                ConnectionClosed
            ):  # the server re-queues a lost connection's work anyway
                await self._send(frame)

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Connect and serve until :meth:`drain` completes; reconnect on failures."""
        health = asyncio.create_task(self._health.watch())
        try:
            await self._health.wait_until_ready(self._stopped)
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
            if self._switch_task is not None:
                self._switch_task.cancel()
            await self._jobs.cancel_all()
            await asyncio.gather(health, return_exceptions=True)  # no read of /metrics under way
            await self._health.close()

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
        await self._jobs.wait()
        self._stopped.set()
        if self._ws is not None:
            await self._ws.close()

    # ------------------------------------------------------------ one connection
    async def _serve_once(self) -> None:
        if self._switch_task is not None:  # a switch the lost connection asked for ends first
            await asyncio.wait({self._switch_task})
        ws = await open_connection(self._settings)
        self._ws = ws
        self._sender = FrameSender(ws)
        sender_task = asyncio.create_task(self._sender.run(), name="frame-sender")
        try:
            if self.loaded:
                await self._factory.prepare()
            if self.switching is not None:
                await self.switching.probe()
            await self.announce()
            servable = [s.config.name for s in self.switching.servable()] if self.switching else []
            logger.info(
                "connected to {} serving {}{}; can switch to: {}",
                work_url(self._settings),
                self._factory.model_config.name,
                "" if self.loaded else " (not loaded)",
                ", ".join(servable) or "nothing",
            )
            async for raw in ws:
                await self._handle(raw)
            raise_if_refused(ws)
        except ConnectionClosed:
            raise_if_refused(ws)
            raise
        finally:
            self._ws = None
            self._sender = None
            sender_task.cancel()
            await asyncio.gather(sender_task, return_exceptions=True)
            # The server re-queues whatever this connection held; results could not be delivered.
            await self._jobs.cancel_all()

    async def _handle(self, raw: str | bytes) -> None:
        try:
            frame = parse_server_frame(raw)
        except ProtocolError as exc:
            self._unreadable(raw, str(exc))
            return
        if isinstance(frame, Ping):
            capacity = await self._health.capacity_for_pong()
            await self._send(
                Pong(
                    ping_id=frame.ping_id,
                    free_slots=self.free_slots,
                    # Without a model (unloaded on request) the backend's health check fails: nothing is wrong.
                    backend_healthy=self._health.healthy or not self.loaded,
                    backend_queue_length=capacity.queue_length,
                    kv_cache_free_tokens=capacity.kv_cache_free_tokens,
                )
            )
        elif isinstance(frame, (Work, EmbedWork)):
            self._start_job(frame)
        elif isinstance(frame, Cancel):
            self._jobs.cancel(frame.message_id)
        elif isinstance(frame, (Tokenize, Detokenize)):
            self._tokenize(frame)
        elif isinstance(frame, (LoadModel, UnloadModel)):
            self._switch(frame)
        elif isinstance(frame, UpgradeRequired):
            raise FatalWorkerError(frame.detail)

    def _unreadable(self, raw: str | bytes, error: str) -> None:
        """A frame this worker cannot read. Work that names its message is answered with a final error
        for it, so the server fails that message at once instead of waiting for an answer that never
        comes; anything else is logged (the server sends nothing else a worker may answer)."""
        named = top_level_strings(raw, ("type", "message_id"))
        message_id = named.get("message_id")
        if named.get("type") not in WORK_FRAME_TYPES or message_id is None:
            logger.error("ignoring a malformed frame from the server: {}", error)
            return
        if message_id in self._jobs:
            return  # a duplicate of work that is running: the job answers for its message
        logger.error("message {}: the work frame cannot be read: {}", message_id, error)
        reason = f"the worker cannot read the work frame: {error}"[:MAX_ERROR_CHARS]
        self._refuse(message_id, reason, retryable=False)

    def _start_job(self, work: Work | EmbedWork) -> None:
        if work.message_id in self._jobs:
            return  # already running it: a duplicate frame, not a second job
        if self.free_slots <= 0:
            reason = "worker is draining" if self._draining else "no free slot"
            if self.switching is not None and self.switching.busy:
                reason = "the worker is switching models"
            elif not self.loaded:
                reason = "the worker has no model loaded"
            elif not self._health.healthy:
                reason = "the backend is unavailable"
            # The server's view of our capacity lagged: not the message's fault, no attempt spent.
            self._refuse(work.message_id, reason, retryable=True, unavailable=True)
            return
        try:
            job = self._factory.create(work)
        except WrongKindOfWork as exc:  # a routing mistake of the server: no worker of this kind can do it
            self._refuse(work.message_id, str(exc), retryable=False)
            return
        self._jobs.start(job, self._send_from_job)

    def _switch(self, frame: LoadModel | UnloadModel) -> None:
        """Start the switch the server asked for, or refuse it at once: one ``failed`` step, then a
        ``worker_info`` saying what is served (unchanged), so the server ends the switch it began. A
        refusal because another switch runs has no ``worker_info``: that switch's own follows it."""
        switching, sender = self.switching, self._sender
        refusal = switching.refusal(frame) if switching is not None else "this worker cannot switch models"
        if switching is None or refusal is not None or sender is None:
            name = frame.model_config_name if isinstance(frame, LoadModel) else self.factory.model_config.name
            logger.warning("refusing {} {}: {}", frame.type, name, refusal)
            failed = ModelSwitch(
                request_id=frame.request_id, model_config_name=name, step="failed", error=refusal
            )
            if refusal == SWITCH_IN_PROGRESS:
                self._send_in_background(failed)
            else:
                self._send_in_background(failed, then_announce=True)
            return
        self._switch_task = switching.start(frame, sender, self)

    # ------------------------------------------------------------ what a switch asks of its connection
    async def finish_jobs(self) -> None:
        await self._jobs.wait()

    async def serve_with(self, jobs: JobFactory, settings: WorkerSettings) -> None:
        """Serve a switched-to model: its jobs (prepared) and settings; the backend's health is checked
        again at once, so that the worker_info that follows finds the connection ready."""
        previous, self._factory, self._settings = self._factory, jobs, settings
        self._health.use(jobs.backend)
        await self._health.check()
        if previous.backend is not jobs.backend:
            await previous.backend.close()

    async def announce(self) -> None:
        """Send what this connection serves now (the first frame, and after a switch)."""
        switching = self.switching
        await self._send(
            worker_info(
                self._settings,
                self._factory.model_config,
                self._factory.backend_info,
                self._factory.tokenizer,
                servable=switching.servable() if switching is not None else None,
                loaded=self.loaded,
            )
        )

    def _tokenize(self, frame: Tokenize | Detokenize) -> None:
        """Answer in the background: frames are read in order, and a count is a backend round trip."""
        tokenizer = self._factory.tokenizer if self._settings.answer_tokenize else None

        async def answer() -> None:
            if tokenizer is None:
                reply: Tokenized | Detokenized = (
                    Tokenized(request_id=frame.request_id, error="this worker does not tokenize")
                    if isinstance(frame, Tokenize)
                    else Detokenized(request_id=frame.request_id, error="this worker does not tokenize")
                )
            else:
                reply = await tokenizer.answer(frame)
            with contextlib.suppress(ConnectionClosed):  # the server does without the answer
                await self._send(reply)

        task = asyncio.create_task(answer(), name=f"{frame.type}-{frame.request_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _refuse(self, message_id: str, error: str, *, retryable: bool, unavailable: bool = False) -> None:
        """Answer work this worker will not run; in the background, as frames are read in order."""
        frame = WorkerError(
            message_id=message_id, error=error, retryable=retryable, backend_unavailable=unavailable
        )
        self._send_in_background(frame)  # the server releases the work anyway if it is lost

    def _send_in_background(self, frame: OutgoingFrame, *, then_announce: bool = False) -> None:
        async def send() -> None:
            with contextlib.suppress(ConnectionClosed):
                await self._send(frame)
                if then_announce:
                    await self.announce()

        task = asyncio.create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_from_job(self, frame: OutgoingFrame) -> None:
        if type(frame) is TokenFrame:  # a job's tokens: queued at once, no coroutine per token
            sender = self._sender
            if sender is not None and sender.queue_token(frame):
                return
        down = isinstance(frame, WorkerError) and (frame.backend_unavailable or frame.backend_died)
        if down and self._health.healthy:
            # The backend refused a job, or died: take no more work until its health check passes
            # again (the server stops sending too).
            self._health.mark_unavailable()
        await self._send(frame)

    async def _send(self, frame: OutgoingFrame) -> None:
        sender = self._sender
        if sender is None:
            raise ConnectionClosed(None, None)
        await sender.send(frame)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        return f"connection closed ({exc.rcvd.code if exc.rcvd else 'no close frame'})"
    return f"{type(exc).__name__}: {exc}"
