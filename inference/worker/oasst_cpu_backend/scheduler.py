"""Admission and continuous batching of generations: one model, one generation thread, a bounded queue.

Requests wait in arrival order for a free sequence slot; the generation thread admits them between
decode steps and decodes every admitted request together (batch.py). The generation thread is the only
one that touches the llama.cpp context. A request's place is freed only when the thread has really
stopped working on it, never merely when its HTTP client went away.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from collections import deque

from loguru import logger

from oasst_cpu_backend.batch import BatchRunner
from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.metrics import BackendMetrics
from oasst_cpu_backend.records import EngineRequest, EngineResult, Step


class OverloadedError(Exception):
    pass


class ShuttingDownError(OverloadedError):
    pass


class Ticket:
    """A submitted generation: its result future and, when streaming, its steps as they come."""

    def __init__(self, request_id: int, job: EngineRequest, stream: bool) -> None:
        self.request_id = request_id
        self.job = job
        self.steps: asyncio.Queue[Step | None] | None = asyncio.Queue() if stream else None
        self.started = threading.Event()
        self.cancel_reason: str | None = None
        self.expired = False
        self._cancel = threading.Event()
        self._work: concurrent.futures.Future[EngineResult] = concurrent.futures.Future()
        self.future: asyncio.Future[EngineResult]

    def cancel(self, reason: str) -> None:
        """Stop the generation within one step; a request still waiting is dropped from the queue at once,
        so that it stops counting against max_concurrent_requests."""
        if not self._cancel.is_set():
            self.cancel_reason = reason
            self._cancel.set()
        self._work.cancel()

    def expire(self) -> None:
        """Give up on a request that waited too long for the model (it must not run any more)."""
        if not self._cancel.is_set():
            self.expired = True
            self.cancel("timed out waiting for a free slot")

    def is_cancelled(self) -> bool:
        return self._cancel.is_set()


class Scheduler:
    def __init__(self, engine: ModelEngine, metrics: BackendMetrics, max_concurrent_requests: int) -> None:
        self._engine = engine
        self._metrics = metrics
        self._max = max_concurrent_requests
        self._runner = BatchRunner(engine)
        self._tickets: set[Ticket] = set()
        self._waiting: deque[tuple[Ticket, asyncio.AbstractEventLoop]] = deque()
        self._wake = threading.Condition()
        self._ids = itertools.count(1)
        self._closed = False
        self._stopping = False
        metrics.max_concurrent.set(max_concurrent_requests)
        metrics.slots_total.set(engine.parallel_sequences)
        self._report_slots()
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        self._thread.start()

    @property
    def admitted(self) -> int:
        return len(self._tickets)

    @property
    def slots_total(self) -> int:
        return self._engine.parallel_sequences

    @property
    def slots_busy(self) -> int:
        return self._runner.slots.busy

    @property
    def kv_free_tokens(self) -> int:
        return self._runner.slots.free_tokens

    def submit(self, job: EngineRequest, *, stream: bool) -> Ticket:
        """Queue a generation. Must be called from the event loop."""
        if self._closed:
            raise ShuttingDownError("Model is not available: the server is shutting down")
        if len(self._tickets) >= self._max:
            self._metrics.requests.labels(outcome="overloaded").inc()
            raise OverloadedError(
                f"Model is overloaded: {len(self._tickets)} requests in flight "
                f"(max_concurrent_requests={self._max})"
            )
        loop = asyncio.get_running_loop()
        ticket = Ticket(next(self._ids), job, stream)
        self._tickets.add(ticket)
        self._metrics.queue_size.inc()
        ticket.future = asyncio.wrap_future(ticket._work, loop=loop)
        ticket.future.add_done_callback(lambda _: self._finished(ticket))
        with self._wake:
            self._waiting.append((ticket, loop))
            self._wake.notify()
        logger.debug(
            "request {} queued: {} prompt tokens, max_new_tokens={}, {} in flight",
            ticket.request_id,
            len(job.prompt_tokens),
            job.max_new_tokens,
            len(self._tickets),
        )
        return ticket

    # ---- the generation thread ----

    def _loop(self) -> None:
        runner = self._runner
        while True:
            with self._wake:
                while not self._stopping and not runner.active and not self._waiting:
                    self._wake.wait()
                if self._stopping and not runner.active and not self._waiting:
                    return
                admissions = []
                while self._waiting and runner.has_room:
                    admissions.append(self._waiting.popleft())
                    if len(admissions) >= runner.slots.free:
                        break
            for ticket, loop in admissions:
                self._admit(ticket, loop)
            self._report_slots()
            try:
                runner.step()
            except BaseException as error:  # never leave a request waiting on a dead thread
                logger.opt(exception=error).error("the generation step failed: {}", error)
                runner.end_all(error)
            self._report_slots()

    def _admit(self, ticket: Ticket, loop: asyncio.AbstractEventLoop) -> None:
        work, job = ticket._work, ticket.job
        if not work.set_running_or_notify_cancel():
            return  # cancelled while queued: its future is done already
        ticket.started.set()
        self._metrics.queue_size.dec()
        if ticket.is_cancelled() or time.monotonic() > min(job.queue_deadline, job.deadline):
            status = "cancelled" if ticket.is_cancelled() and not ticket.expired else "queue_timeout"
            now = time.monotonic()
            work.set_result(
                EngineResult(
                    status=status, prompt_tokens=len(job.prompt_tokens), started_at=now, finished_at=now
                )
            )
            return
        steps = ticket.steps

        def on_step(step: Step) -> None:
            if steps is not None:
                loop.call_soon_threadsafe(steps.put_nowait, step)

        def on_done(outcome: EngineResult | BaseException) -> None:
            self._metrics.running.dec()
            if isinstance(outcome, BaseException):
                work.set_exception(outcome)
            else:
                work.set_result(outcome)

        self._metrics.running.inc()
        try:
            self._runner.start(
                job,
                is_cancelled=ticket.is_cancelled,
                on_step=on_step if steps is not None else None,
                on_done=on_done,
            )
        except BaseException as error:
            self._metrics.running.dec()
            work.set_exception(error)

    def _report_slots(self) -> None:
        self._metrics.slots_busy.set(self._runner.slots.busy)
        self._metrics.kv_cache_free_tokens.set(self._runner.slots.free_tokens)

    def _finished(self, ticket: Ticket) -> None:
        self._tickets.discard(ticket)
        if not ticket.started.is_set():
            self._metrics.queue_size.dec()
        if ticket.steps is not None:
            ticket.steps.put_nowait(None)
        future = ticket.future
        if future.cancelled():
            if ticket.expired:
                self._metrics.requests.labels(outcome="queue_timeout").inc()
                logger.warning("request {} stopped: queue_timeout after 0 tokens", ticket.request_id)
            else:
                self._metrics.requests.labels(outcome="cancelled").inc()
                self._metrics.cancellations.inc()
                logger.info(
                    "request {} cancelled after 0 tokens ({}, while queued)",
                    ticket.request_id,
                    ticket.cancel_reason,
                )
            return
        error = future.exception()
        if error is not None:
            self._metrics.requests.labels(outcome="error").inc()
            logger.opt(exception=error).error("request {} failed: {}", ticket.request_id, error)
            return
        self._record(ticket, future.result())

    def _record(self, ticket: Ticket, result: EngineResult) -> None:
        job, metrics = ticket.job, self._metrics
        outcome = "success" if result.status == "finished" else result.status
        metrics.requests.labels(outcome=outcome).inc()
        metrics.generated_tokens.inc(result.generated_tokens)
        if result.started_at is not None:
            metrics.queue_wait.observe(max(0.0, result.started_at - job.enqueued_at))
        if result.first_token_at is not None:
            metrics.time_to_first_token.observe(result.first_token_at - job.enqueued_at)
            if result.generated_tokens > 1:
                decode = result.finished_at - result.first_token_at
                metrics.time_per_output_token.observe(decode / (result.generated_tokens - 1))
        if result.status in ("finished", "cancelled", "timeout") and result.started_at is not None:
            metrics.prompt_tokens.inc(result.prompt_tokens)
            metrics.reused_prompt_tokens.inc(result.reused_prompt_tokens)
            metrics.input_length.observe(result.prompt_tokens)
        metrics.request_duration.observe(result.finished_at - job.enqueued_at)
        if result.status == "finished" and result.summary is not None:
            metrics.generated_tokens_per_request.observe(result.generated_tokens)
            elapsed = result.finished_at - (result.started_at or job.enqueued_at)
            logger.info(
                "request {} finished ({}): {} tokens in {:.2f}s, prompt {} tokens ({} cached), "
                "first token after {:.3f}s",
                ticket.request_id,
                result.summary.finish_reason,
                result.generated_tokens,
                elapsed,
                result.prompt_tokens,
                result.reused_prompt_tokens,
                (result.first_token_at or result.finished_at) - job.enqueued_at,
            )
        elif result.status == "cancelled":
            metrics.cancellations.inc()
            logger.info(
                "request {} cancelled after {} tokens ({})",
                ticket.request_id,
                result.generated_tokens,
                ticket.cancel_reason or "cancelled",
            )
        else:
            logger.warning(
                "request {} stopped: {} after {} tokens",
                ticket.request_id,
                result.status,
                result.generated_tokens,
            )

    def stop_accepting(self) -> None:
        """Refuse new requests and end the ones in flight, so that their clients learn at once that they
        must retry elsewhere instead of waiting out the server's graceful-shutdown period."""
        if not self._closed:
            logger.info("no longer accepting requests; ending {} in flight", len(self._tickets))
        self._closed = True
        for ticket in list(self._tickets):
            ticket.cancel("server shutting down")

    def shutdown(self) -> None:
        """Stop every generation (within one step) and wait for the generation thread to end."""
        self.stop_accepting()
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()
