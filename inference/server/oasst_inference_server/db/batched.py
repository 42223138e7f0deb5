"""Statements shared by the asks that come while one runs: a burst becomes a few statements, not thousands.

When thousands of answers end within seconds (``bench.many_streams``' release), a statement each makes
them wait for connections: under a busy event loop a statement's time is the loop's latency more than the
database's, so a pool of N connections carries N statements per loop turn, whatever each one does. A
:class:`Batched` runs an ask at once while fewer than ``limit`` of its statements run; the asks that come
meanwhile wait together and the next statement carries them all (up to ``max_batch``). With nothing else
asked it adds no wait; under a burst one statement serves hundreds.

``size`` and ``max_bytes``: a statement carries asks of at most ``max_bytes`` together (an ask larger than
that alone), so a burst of large asks (answers of up to a worker frame each) never becomes one statement
of hundreds of megabytes.

``key``: asks with the same key never share a statement (a message ended twice: the second waits for the
next, which sees the first's result). Failure semantics are those of a statement per ask: a statement
that fails raises in every ask it carried, and an asker that stops waiting does not stop the statement.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

A = TypeVar("A")
R = TypeVar("R")


class Batched(Generic[A, R]):
    def __init__(
        self,
        run: Callable[[list[A]], Awaitable[list[R]]],
        *,
        limit: int,
        max_batch: int = 500,
        key: Callable[[A], Hashable] | None = None,
        size: Callable[[A], int] | None = None,
        max_bytes: int = 8 << 20,
        name: str = "batched statement",
    ) -> None:
        self._run = run  # one statement for the asks, answering each in order
        self._limit = limit
        self._max_batch = max_batch
        self._key = key
        self._size = size
        self._max_bytes = max_bytes
        self._name = name
        self._waiting: list[tuple[A, asyncio.Future[R]]] = []
        self._running: set[asyncio.Task[None]] = set()
        self.statements = 0  # statements run (for tests and the logs)

    async def ask(self, item: A) -> R:
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, done))
        self._start()
        # Shielded: an asker that leaves does not cancel the statement of the others.
        return await asyncio.shield(done)

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    def _start(self) -> None:
        while self._waiting and len(self._running) < self._limit:
            task = asyncio.create_task(self._carry(self._take()), name=self._name)
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _take(self) -> list[tuple[A, asyncio.Future[R]]]:
        """Up to ``max_batch`` waiting asks and ``max_bytes`` (at least one ask), oldest first, no key twice."""
        batch: list[tuple[A, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        rest: list[tuple[A, asyncio.Future[R]]] = []
        carried = 0
        for ask in self._waiting:
            key = self._key(ask[0]) if self._key is not None else None
            size = self._size(ask[0]) if self._size is not None else 0
            fits = not batch or carried + size <= self._max_bytes
            if len(batch) < self._max_batch and fits and (key is None or key not in keys):
                keys.add(key)
                carried += size
                batch.append(ask)
            else:
                rest.append(ask)
        self._waiting = rest
        return batch

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _carry(self, batch: list[tuple[A, asyncio.Future[R]]]) -> None:
        self.statements += 1
        try:
            results = await self._run([item for item, _ in batch])
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else RuntimeError(f"{self._name} stopped")
            for _, done in batch:
                if not done.done():
                    done.set_exception(error)
                    done.exception()  # seen: its asker may have left
            if not isinstance(exc, Exception):
                raise
            return
        for (_, done), result in zip(batch, results, strict=True):
            if not done.done():
                done.set_result(result)
