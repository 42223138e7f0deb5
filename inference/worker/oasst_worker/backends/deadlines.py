"""Bounding each step of a backend stream: the next token within the stall timeout, all of it before the
generation's deadline.

``asyncio.wait_for`` wraps what it awaits in a task of its own, so bounding every token with it cost a
task, and a turn of the event loop, per token; an ``asyncio.timeout`` per step still costs a timer
handle and a context per token. :class:`StepDeadline` keeps one lazy timer per stream instead: a step
only notes when it began (one clock read), and the timer, when it fires, cancels the job's task if the
step under way is older than the stall timeout (or the total deadline has passed), or else sets itself
for the step's own due time. Between steps no clock runs: a generator that yields a token lets its
consumer run, and wait on a slow server, without the backend's clock ticking.

    deadline = StepDeadline(stall=30.0, total=600.0)
    item = await deadline.step(anext(stream))   # asyncio.TimeoutError past either bound

An expiry cancels the task the steps run in and turns that cancellation back into ``TimeoutError`` at
the step (``Task.uncancel``, as ``asyncio.timeout`` does); a cancellation from anyone else stays one.
On Python 3.10 (no ``Task.uncancel``) each step is an ``asyncio.wait_for``, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

_LAZY = hasattr(asyncio.Task, "uncancel")  # Python 3.11+


class StepDeadline:
    def __init__(self, *, stall: float, total: float | None = None) -> None:
        self._stall = stall
        self._loop = asyncio.get_running_loop()
        self._end = None if total is None else self._loop.time() + total
        self._task: asyncio.Task[object] | None = None
        self._step_began: float | None = None  # None between steps
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False

    async def step(self, awaitable: Awaitable[T]) -> T:
        """``awaitable``'s result, if it comes within the stall timeout and before the total deadline."""
        began = self._loop.time()
        if not _LAZY:
            return await asyncio.wait_for(awaitable, max(0.0, self._due(began) - began))
        if self._timer is None:
            self._task = asyncio.current_task()
            self._timer = self._loop.call_at(self._due(began), self._check)
        self._step_began = began
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._expired and self._task is not None:
                self._expired = False
                if self._task.uncancel() == 0:  # ours alone: the step timed out
                    raise asyncio.TimeoutError from None
            raise
        finally:
            self._step_began = None
            if self._expired and self._task is not None:  # the step swallowed our cancel: take it back
                self._expired = False
                self._task.uncancel()

    @property
    def overran(self) -> bool:
        """Whether the total deadline has passed (else an expiry was a stall)."""
        return self._end is not None and self._loop.time() >= self._end

    def _due(self, began: float) -> float:
        due = began + self._stall
        return due if self._end is None or due < self._end else self._end

    def _check(self) -> None:
        self._timer = None
        began = self._step_began
        if began is None or self._task is None:
            return  # between steps: the next step sets the timer again
        due = self._due(began)
        if self._loop.time() >= due:
            self._expired = True
            self._task.cancel()
        else:
            self._timer = self._loop.call_at(due, self._check)
