"""Batched lease extensions (``dispatch.lease_extensions``), on the real Postgres: the pongs of many
workers become one statement that extends every lease they hold, and nothing else; a worker that asks
nothing (silent, or gone) keeps its deadline and loses its lease; a failed statement is survived."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import asyncpg
import pytest
from sqlalchemy import update

from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.dispatch import lease_extensions
from oasst_inference_server.dispatch.lease_extensions import LeaseExtensions, lease_interval
from oasst_inference_server.settings import Settings
from tests.support.api import API, start_chat
from tests.support.sql_statements import recorded_statements

pytestmark = API

LEASE = 30.0


class Told:
    """An ``on_stop`` callback that records what it was told, per session."""

    def __init__(self) -> None:
        self.stops: dict[str, list[str]] = {}

    def callback(self, session_id: str):  # type: ignore[no-untyped-def]
        async def on_stop(message_ids: list[str]) -> None:
            self.stops[session_id] = message_ids

        return on_stop


async def claimed(app, client, user, model: str, session_id: str) -> str:  # type: ignore[no-untyped-def]
    """A message in progress for ``session_id``, its lease ending in a second."""
    chat = await start_chat(client, user, "hold me", model)
    assert await app.state.lifecycle.claim(chat.assistant_id, session_id) is not None
    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage)
            .where(DbMessage.id == chat.assistant_id)
            .values(lease_deadline=utcnow() + timedelta(seconds=1))
        )
        await session.commit()
    return chat.assistant_id


async def lease_of(app, message_id: str) -> datetime | None:  # type: ignore[no-untyped-def]
    message = await app.state.lifecycle.get(message_id)
    assert message is not None
    return message.lease_deadline


async def finish(app, leases: LeaseExtensions, held: list[tuple[str, str]]) -> None:  # type: ignore[no-untyped-def]
    """End the test's messages (``(session id, message id)``) and its lease extensions."""
    for session_id, message_id in held:
        await app.state.lifecycle.release(message_id, session_id, "test over", retryable=False)
    await leases.close()


def extended(deadline: datetime | None) -> bool:
    return deadline is not None and deadline > utcnow() + timedelta(seconds=LEASE - 10)


async def test_one_statement_extends_the_leases_of_every_worker_that_asked(app, client, user, live_model):
    held = {sid: await claimed(app, client, user, live_model, sid) for sid in ("ws-l1", "ws-l2", "ws-l3")}
    second = await claimed(app, client, user, live_model, "ws-l1")  # ws-l1 holds two
    leases = LeaseExtensions(app.state.session_factory, lease_seconds=LEASE, interval=3600)
    told = Told()
    for sid in ("ws-l1", "ws-l2"):  # ws-l3 is silent
        leases.extend_soon(sid, {held[sid]} | ({second} if sid == "ws-l1" else set()), told.callback(sid))
    with recorded_statements(app) as statements:
        await leases.flush()
    updates = [text for text in statements if text.upper().startswith("UPDATE")]
    assert len(updates) == 1
    assert extended(await lease_of(app, held["ws-l1"])) and extended(await lease_of(app, second))
    assert extended(await lease_of(app, held["ws-l2"]))
    assert not extended(await lease_of(app, held["ws-l3"]))  # a silent worker's lease runs out
    assert told.stops == {}  # all still theirs, none cancelled
    await finish(app, leases, [*held.items(), ("ws-l1", second)])


async def test_a_released_message_is_not_extended_and_its_worker_is_told_to_stop(
    app, client, user, live_model
):
    kept = await claimed(app, client, user, live_model, "ws-r1")
    released = await claimed(app, client, user, live_model, "ws-r1")
    cancelled = await claimed(app, client, user, live_model, "ws-r1")
    await app.state.lifecycle.release(released, "ws-r1", "the backend dropped the stream")
    await app.state.lifecycle.request_cancel(await app.state.lifecycle.get(cancelled))
    leases = LeaseExtensions(app.state.session_factory, lease_seconds=LEASE, interval=3600)
    told = Told()
    leases.extend_soon("ws-r1", {kept, released, cancelled}, told.callback("ws-r1"))
    await leases.flush()
    await asyncio.sleep(0)  # the callback runs in a task of its own
    await asyncio.sleep(0)
    assert sorted(told.stops["ws-r1"]) == sorted([released, cancelled])
    assert extended(await lease_of(app, kept))
    back = await app.state.lifecycle.get(released)
    assert back is not None and back.state == "pending" and back.lease_deadline is None
    await finish(app, leases, [("ws-r1", kept)])


async def test_a_failed_statement_is_survived_and_the_next_pongs_extend(
    app, client, user, live_model, monkeypatch: pytest.MonkeyPatch
):
    message_id = await claimed(app, client, user, live_model, "ws-f1")
    real = lease_extensions.extend

    async def down(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ConnectionRefusedError("the database is down")

    monkeypatch.setattr(lease_extensions, "extend", down)
    leases = LeaseExtensions(app.state.session_factory, lease_seconds=LEASE, interval=0.02)
    told = Told()
    leases.extend_soon("ws-f1", {message_id}, told.callback("ws-f1"))
    await leases.flush()  # logged, not raised
    assert not extended(await lease_of(app, message_id))
    monkeypatch.setattr(lease_extensions, "extend", real)
    leases.extend_soon("ws-f1", {message_id}, told.callback("ws-f1"))  # the next pong
    async with asyncio.timeout(5):
        while not extended(await lease_of(app, message_id)):
            await asyncio.sleep(0.02)
    assert told.stops == {}
    await finish(app, leases, [("ws-f1", message_id)])


async def test_the_runner_extends_within_its_interval_then_stops_and_a_gone_session_is_forgotten(
    app, client, user, live_model
):
    gone = await claimed(app, client, user, live_model, "ws-g1")
    alive = await claimed(app, client, user, live_model, "ws-g2")
    leases = LeaseExtensions(app.state.session_factory, lease_seconds=LEASE, interval=0.05)
    told = Told()
    leases.extend_soon("ws-g1", {gone}, told.callback("ws-g1"))
    leases.extend_soon("ws-g2", {alive}, told.callback("ws-g2"))
    leases.forget("ws-g1")  # its connection ended before the statement
    async with asyncio.timeout(5):
        while not extended(await lease_of(app, alive)):
            await asyncio.sleep(0.02)
    assert not extended(await lease_of(app, gone))
    runner = leases._runner
    assert runner is not None
    async with asyncio.timeout(5):
        await runner  # nothing more asked: the runner ends, and the next ask starts another
    await finish(app, leases, [("ws-g1", gone), ("ws-g2", alive)])


async def test_the_interval_is_well_inside_the_ping_interval_and_the_lease() -> None:
    default = Settings(database_url="sqlite+aiosqlite://")
    assert lease_interval(default) == 1.0
    quick = Settings(database_url="sqlite+aiosqlite://", worker_ping_interval=0.5, lease_seconds=0.6)
    assert lease_interval(quick) == pytest.approx(0.06)


async def test_leases_are_extended_while_requests_hold_every_connection_of_the_pool(
    app, client, user, live_model
):
    """Readers and requests that take every pooled connection (thousands of open streams) must not
    starve the lease extensions: they have a connection of their own."""
    message_id = await claimed(app, client, user, live_model, "ws-p1")
    engine = app.state.engine
    size = app.state.settings.database_pool_size
    held = [await engine.connect() for _ in range(2 * size)]  # the pool and its overflow
    try:
        leases = app.state.lifecycle.leases
        told = Told()
        leases.extend_soon("ws-p1", {message_id}, told.callback("ws-p1"))
        async with asyncio.timeout(10):  # the request pool would make it wait 30 s, then fail
            await leases.flush()
    finally:
        for connection in held:
            await connection.close()
    assert extended(await lease_of(app, message_id))
    await app.state.lifecycle.release(message_id, "ws-p1", "test over", retryable=False)


async def test_each_statement_commits_so_no_rows_are_held_out_of_id_order(
    app, client, user, live_model, monkeypatch
) -> None:
    """A flush of more sessions than one statement takes commits each statement: a transaction holding
    the first statement's rows while it locked the second's would lock out of id order, and deadlock
    with a statement that locks in id order (answers' ends)."""
    first = await claimed(app, client, user, live_model, "ws-order-x")
    second = await claimed(app, client, user, live_model, "ws-order-y")
    high, low = max(first, second), min(first, second)
    # The session whose statement runs first (sessions in order) holds the higher message.
    for message_id, session_id in ((high, "ws-order-a"), (low, "ws-order-b")):
        async with app.state.session_factory() as session:
            await session.exec(
                update(DbMessage).where(DbMessage.id == message_id).values(worker_session_id=session_id)
            )
            await session.commit()
    monkeypatch.setattr(lease_extensions, "_SESSIONS_PER_STATEMENT", 1)
    url = app.state.settings.database_url.replace("postgresql+asyncpg://", "postgresql://")
    other = await asyncpg.connect(url)
    leases = LeaseExtensions(app.state.session_factory, lease_seconds=LEASE, interval=0.01)
    try:
        transaction = other.transaction()
        await transaction.start()
        await other.execute("SELECT id FROM message WHERE id = $1 FOR UPDATE", low)
        told = Told()
        for session_id in ("ws-order-a", "ws-order-b"):
            leases.extend_soon(session_id, [], told.callback(session_id))
        flushing = asyncio.create_task(leases.flush())
        await asyncio.sleep(0.3)  # the first statement ran; the second waits for the lower message
        # In id order the other goes on to the higher: the first statement's commit let it go.
        await asyncio.wait_for(other.execute("SELECT id FROM message WHERE id = $1 FOR UPDATE", high), 5)
        await transaction.commit()
        await asyncio.wait_for(flushing, 10)
    finally:
        await other.close()
    for message_id in (high, low):
        assert (await lease_of(app, message_id)) > utcnow() + timedelta(seconds=LEASE / 2)
    await finish(app, leases, [("ws-order-a", high), ("ws-order-b", low)])
