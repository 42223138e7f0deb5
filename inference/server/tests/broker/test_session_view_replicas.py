"""The cached worker-session view and the live models across two replicas sharing one Redis: a
worker that connects to or leaves another replica shows within ``max_age``; a request for a model the
view lacks reads afresh, so none is told "no worker" because of a cached view."""

from __future__ import annotations

import asyncio
import time

import pytest

from oasst_inference_server.broker import RedisBroker
from oasst_inference_server.broker.session_view import WorkerSessionView
from oasst_inference_server.scheduling.worker_registry import WorkerRegistry
from tests.support.sessions import session_record

pytestmark = pytest.mark.redis

HOUR = 3600.0


async def names(view: WorkerSessionView, *, fresh: bool = False) -> list[str]:
    return sorted(s.model_config_.name for s in await view.sessions(fresh=fresh))


async def test_another_replica_s_worker_shows_and_goes_within_max_age(
    replicas: tuple[RedisBroker, RedisBroker],
) -> None:
    here, there = replicas
    view = WorkerSessionView(here, max_age=0.3)
    assert await names(view) == []
    await there.put_worker_session(session_record("ws-there", "model-there"), ttl=60)
    assert await names(view) == []  # the cached read, younger than max_age
    assert await names(view, fresh=True) == ["model-there"]
    await there.remove_worker_session("ws-there")
    started = time.monotonic()
    while await names(view):
        assert time.monotonic() - started < 0.3 + 0.2, "the gone worker stayed past max_age"
        await asyncio.sleep(0.02)


async def test_a_worker_of_another_replica_whose_record_expired_disappears(
    replicas: tuple[RedisBroker, RedisBroker],
) -> None:
    here, there = replicas
    view = WorkerSessionView(here, max_age=0.1)
    await there.put_worker_session(session_record("ws-there", "model-there"), ttl=0.3)
    assert await names(view, fresh=True) == ["model-there"]
    started = time.monotonic()
    while await names(view):
        assert time.monotonic() - started < 2.0, "the expired session stayed in the view"
        await asyncio.sleep(0.05)


async def test_a_request_for_a_model_the_view_lacks_reads_afresh(
    replicas: tuple[RedisBroker, RedisBroker],
) -> None:
    here, there = replicas
    registry = WorkerRegistry(here, max_age=HOUR)
    await here.put_worker_session(session_record("ws-here", "model-here"), ttl=60)
    assert list(await registry.live_models()) == ["model-here"]
    await there.put_worker_session(session_record("ws-there", "model-there", free_slots=2), ttl=60)
    assert list(await registry.live_models()) == ["model-here"]  # cached: nobody asked for it
    live = await registry.live_models(wanted="model-there")
    assert sorted(live) == ["model-here", "model-there"]
    assert live["model-there"].worker_count == 1 and live["model-there"].free_slots == 2
    # Still absent after a fresh read: the caller gets its "no worker" answer from a current view.
    assert "model-gone" not in await registry.live_models(wanted="model-gone")


async def test_the_live_models_follow_this_replica_s_workers_at_once(
    replicas: tuple[RedisBroker, RedisBroker],
) -> None:
    here, there = replicas
    registry = WorkerRegistry(here, max_age=HOUR)
    await there.put_worker_session(session_record("ws-there", "shared"), ttl=60)
    assert (await registry.live_models())["shared"].worker_count == 1
    await here.put_worker_session(session_record("ws-here", "shared"), ttl=60)
    assert (await registry.live_models())["shared"].worker_count == 2
    await here.remove_worker_session("ws-here")
    assert (await registry.live_models())["shared"].worker_count == 1
    await here.put_worker_session(session_record("ws-here-2", "mine"), ttl=60)
    await here.remove_worker_session("ws-here-2")
    assert "mine" not in await registry.live_models()
