"""Step deadlines of a backend stream: each step in the caller's own task, bounded by the stall timeout and
the total deadline, with no clock running between steps."""

from __future__ import annotations

import asyncio

import pytest

from oasst_worker.backends.deadlines import StepDeadline


async def test_a_step_runs_in_the_caller_s_task_not_a_task_of_its_own() -> None:
    caller = asyncio.current_task()
    seen: list[asyncio.Task[object] | None] = []

    async def next_token() -> str:
        seen.append(asyncio.current_task())
        await asyncio.sleep(0)
        return " token"

    deadline = StepDeadline(stall=5.0, total=60.0)
    assert [await deadline.step(next_token()) for _ in range(3)] == [" token"] * 3
    assert seen == [caller] * 3


async def test_a_stalled_step_times_out_as_a_stall() -> None:
    deadline = StepDeadline(stall=0.05, total=60.0)
    with pytest.raises(asyncio.TimeoutError):
        await deadline.step(asyncio.Event().wait())
    assert not deadline.overran


async def test_the_total_deadline_bounds_a_step_shorter_than_the_stall_timeout() -> None:
    deadline = StepDeadline(stall=60.0, total=0.05)
    with pytest.raises(asyncio.TimeoutError):
        await deadline.step(asyncio.Event().wait())
    assert deadline.overran


async def test_no_clock_runs_between_steps() -> None:
    # The consumer of a stream may take longer than the stall timeout between tokens (a slow server):
    # only the awaiting of the next token is bounded.
    deadline = StepDeadline(stall=0.05)
    assert await deadline.step(asyncio.sleep(0, "a")) == "a"
    await asyncio.sleep(0.15)
    assert await deadline.step(asyncio.sleep(0, "b")) == "b"


async def test_a_cancel_of_the_caller_is_a_cancel_not_a_timeout() -> None:
    started = asyncio.Event()

    async def stream_step() -> None:
        started.set()
        await asyncio.Event().wait()

    deadline = StepDeadline(stall=60.0)
    task = asyncio.create_task(deadline.step(stream_step()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_one_deadline_bounds_many_steps_and_a_late_one_still_times_out() -> None:
    deadline = StepDeadline(stall=0.05)
    for i in range(100):  # steps far shorter than the stall timeout, one after another
        assert await deadline.step(asyncio.sleep(0, i)) == i
    with pytest.raises(asyncio.TimeoutError):
        await deadline.step(asyncio.Event().wait())
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert await deadline.step(asyncio.sleep(0, "after")) == "after"  # the task is not left cancelled
