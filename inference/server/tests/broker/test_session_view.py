"""The process's cached view of the worker sessions (``broker.session_view``), on both brokers: a
session this process puts or removes shows at once, a read is shared and reused for ``max_age``,
and an unchanged record is not parsed again. Across replicas: ``test_session_view_replicas.py``."""

from __future__ import annotations

import asyncio

import pytest

from oasst_inference_server.broker import Broker, BrokerError, WorkerSession, WorkerSessionRecord
from oasst_inference_server.broker.session_view import WorkerSessionView
from tests.support.sessions import session_record

HOUR = 3600.0


def delay_reads(
    monkeypatch: pytest.MonkeyPatch, broker: Broker, seconds: float, *, fail: bool = False
) -> None:
    """Every read of the sessions takes ``seconds`` (then raises BrokerError with ``fail``)."""
    real = broker.list_worker_sessions

    async def delayed() -> list[WorkerSessionRecord]:
        await asyncio.sleep(seconds)
        if fail:
            raise BrokerError("down")
        return await real()

    monkeypatch.setattr(broker, "list_worker_sessions", delayed)


async def test_a_session_this_process_puts_or_removes_shows_at_once(broker: Broker) -> None:
    view = WorkerSessionView(broker, max_age=HOUR)
    assert await view.sessions() == []
    await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
    assert [s.model_config_.name for s in await view.sessions()] == ["model-a"]
    await broker.put_worker_session(session_record("ws-b", "model-b"), ttl=60)
    assert sorted(s.model_config_.name for s in await view.sessions()) == ["model-a", "model-b"]
    await broker.remove_worker_session("ws-a")
    assert [s.model_config_.name for s in await view.sessions()] == ["model-b"]


async def test_a_read_is_reused_within_max_age_and_shared_by_callers_at_the_same_time(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
    reads = 0
    real = broker.list_worker_sessions

    async def counted() -> list[WorkerSessionRecord]:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.05)
        return await real()

    monkeypatch.setattr(broker, "list_worker_sessions", counted)
    view = WorkerSessionView(broker, max_age=0.5)
    together = await asyncio.gather(*(view.snapshot() for _ in range(20)))
    assert reads == 1 and all(s is together[0] for s in together)
    assert await view.snapshot() is together[0]  # within max_age: no read
    refresh = 0
    while (await view.snapshot()) is together[0]:  # a refresh of the record keeps it, not the read
        await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
        refresh += 1
        await asyncio.sleep(0.05)
    assert reads == 2 and refresh >= 5
    assert (await view.snapshot(fresh=True)) is not together[0] and reads == 3


async def test_an_unchanged_record_is_not_parsed_again(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    real = WorkerSession.of

    def counted(record: WorkerSessionRecord) -> WorkerSession | None:
        parsed.append(record.session_id)
        return real(record)

    monkeypatch.setattr(WorkerSession, "of", staticmethod(counted))
    view = WorkerSessionView(broker, max_age=HOUR)
    await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
    await broker.put_worker_session(session_record("ws-b", "model-b", free_slots=1), ttl=60)
    await view.sessions()
    assert sorted(parsed) == ["ws-a", "ws-b"]
    parsed.clear()
    await broker.put_worker_session(session_record("ws-b", "model-b", free_slots=0), ttl=60)  # changed
    await broker.put_worker_session(session_record("ws-c", "model-c"), ttl=60)  # new
    sessions = {s.model_config_.name: s for s in await view.sessions(fresh=True)}
    assert sorted(parsed) == ["ws-b", "ws-c"]
    assert sessions["model-b"].free_slots == 0
    parsed.clear()
    await view.sessions(fresh=True)
    assert parsed == []


async def test_a_record_this_version_cannot_read_is_left_out(broker: Broker) -> None:
    view = WorkerSessionView(broker, max_age=HOUR)
    await broker.put_worker_session(WorkerSessionRecord("ws-odd", "model-x", '{"free": 1}'), ttl=60)
    await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
    snapshot = await view.snapshot()
    assert list(snapshot.sessions) == ["ws-a"]


async def test_a_broker_error_reaches_every_caller_and_the_next_read_recovers(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
    with monkeypatch.context() as patched:
        delay_reads(patched, broker, 0.01, fail=True)
        view = WorkerSessionView(broker, max_age=HOUR)
        results = await asyncio.gather(*(view.sessions() for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, BrokerError) for r in results)
    assert [s.model_config_.name for s in await view.sessions()] == ["model-a"]


async def test_a_caller_that_gives_up_does_not_cancel_the_others_read(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
    delay_reads(monkeypatch, broker, 0.1)
    view = WorkerSessionView(broker, max_age=HOUR)
    impatient = asyncio.create_task(view.sessions())
    patient = asyncio.create_task(view.sessions())
    await asyncio.sleep(0.02)
    impatient.cancel()
    assert [s.model_config_.name for s in await patient] == ["model-a"]
    with pytest.raises(asyncio.CancelledError):
        await impatient


@pytest.mark.timeout(60)
async def test_a_caller_that_comes_just_as_a_read_ends_gets_an_answer(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that runs after a read has ended but before the tasks waiting on it have woken must
    not take the ended read for one under way (and wait on it forever, never yielding)."""
    await broker.put_worker_session(session_record("ws-a", "model-a"), ttl=60)
    gate = asyncio.Event()
    real = broker.list_worker_sessions

    async def gated() -> list[WorkerSessionRecord]:
        await gate.wait()
        return await real()

    monkeypatch.setattr(broker, "list_worker_sessions", gated)
    view = WorkerSessionView(broker, max_age=0.0)
    first = asyncio.create_task(view.sessions())
    await asyncio.sleep(0.01)  # its read waits at the gate
    gate.set()  # the read runs next...
    late = asyncio.create_task(view.sessions())  # ...then this caller, before the first one wakes
    async with asyncio.timeout(10):
        assert [s.model_config_.name for s in await late] == ["model-a"]
        assert [s.model_config_.name for s in await first] == ["model-a"]
