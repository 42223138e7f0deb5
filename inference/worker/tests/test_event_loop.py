"""The worker runs on uvloop unless told otherwise (oasst_worker/event_loop.py)."""

from __future__ import annotations

import asyncio

import uvloop

from oasst_worker.event_loop import run
from oasst_worker.settings import WorkerSettings


async def loop_type() -> type:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


def test_the_default_loop_is_uvloop() -> None:
    choice = WorkerSettings(api_key="k").event_loop
    assert choice == "uvloop"
    assert run(loop_type(), choice) is uvloop.Loop


def test_asyncio_s_own_loop_when_asked() -> None:
    assert not issubclass(run(loop_type(), "asyncio"), uvloop.Loop)
