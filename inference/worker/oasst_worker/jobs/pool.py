"""The jobs running on one connection, each in a task of its own, by message id."""

from __future__ import annotations

import asyncio
import contextlib

from loguru import logger
from websockets.exceptions import ConnectionClosed

from oasst_shared.protocol import WorkerError
from oasst_worker.jobs.base import Job, Send


class JobPool:
    def __init__(self) -> None:
        self._running: dict[str, tuple[Job, asyncio.Task[None]]] = {}
        self._started: set[str] = set()  # jobs whose task has begun to run
        self.ended = 0  # jobs ended so far (what the backend's capacity figures may not show yet)

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._running

    def start(self, job: Job, send: Send) -> None:
        task = asyncio.create_task(self._run(job, send))
        self._running[job.work.message_id] = (job, task)

    def cancel(self, message_id: str) -> None:
        """The server cancelled the message: stop its job (it sends what it has as the result)."""
        entry = self._running.get(message_id)
        if entry is not None:
            job, task = entry
            job.cancel_requested = True
            # A task cancelled before its first step never runs its body: the job would never answer
            # (the server would hold the message, the slot would stay taken). One not started yet is
            # cancelled by _run once the job has begun, and answers as cancelled.
            if message_id in self._started:
                task.cancel()

    async def wait(self) -> None:
        """Until every job has ended, those started meanwhile included."""
        while self._running:
            await asyncio.gather(*(task for _, task in self._running.values()), return_exceptions=True)

    async def abort_all(self) -> list[str]:
        """The backend is gone: stop every job without a result and return their message ids (the caller
        hands them back to the server)."""
        ids = list(self._running)
        await self.cancel_all()
        return ids

    async def cancel_all(self) -> None:
        """The connection is gone: stop every job without a result (the server re-queues the messages)."""
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
        self._started.clear()

    async def _run(self, job: Job, send: Send) -> None:
        message_id = job.work.message_id
        self._started.add(message_id)
        task = asyncio.current_task()
        if job.cancel_requested and task is not None:
            asyncio.get_running_loop().call_soon(task.cancel)  # lands inside the job's own handling
        try:
            await job.run(send)
        except ConnectionClosed:
            logger.warning("message {}: connection lost; the server will retry it", message_id)
        except Exception as exc:
            logger.opt(exception=exc).error("message {}: unexpected failure", message_id)
            with contextlib.suppress(Exception):
                await send(WorkerError(message_id=message_id, error=f"worker error: {exc}", retryable=True))
        finally:
            self._running.pop(message_id, None)
            self.ended += 1
            self._started.discard(message_id)
