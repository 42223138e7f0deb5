"""Bounding each step of a backend stream: the next token within the stall timeout, all of it before the
generation's deadline.

``asyncio.wait_for`` wraps what it awaits in a task of its own, so bounding every token with it cost
a task, and a turn of the event loop, per token. :meth:`StepDeadline.step` awaits in the job's own task
under ``asyncio.timeout_at`` (a timer handle per token). Between steps no clock runs: a generator that
yields a token lets its consumer run, and wait on a slow server, without the backend's clock ticking.

    deadline = StepDeadline(stall=30.0, total=600.0)
    item = await deadline.step(anext(stream))   # asyncio.TimeoutError past either bound

On Python 3.10 (no ``asyncio.timeout_at``) each step is an ``asyncio.wait_for``, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class StepDeadline:
    def __init__(self, *, stall: float, total: float | None = None) -> None:
        self._stall = stall
        self._loop = asyncio.get_running_loop()
        self._end = None if total is None else self._loop.time() + total

    async def step(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, if it comes within the stall timeout and before the total deadline."""
        when = self._loop.time() + self._stall
        if self._end is not None and self._end < when:
            when = self._end
        if not hasattr(asyncio, "timeout_at"):  # Python 3.10
            return await asyncio.wait_for(awaitable, max(0.0, when - self._loop.time()))
        async with asyncio.timeout_at(when):
            return await awaitable

    @property
    def overran(self) -> bool:
        """Whether the total deadline has passed (else an expiry was a stall)."""
        return self._end is not None and self._loop.time() >= self._end
