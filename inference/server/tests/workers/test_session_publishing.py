"""A worker's pongs write its session record only when it changed (free slots, backend health...) or when
the last write has lived half its TTL: a thousand workers' pongs that report what their records already
say cost the broker no write. A real ``WorkerConnection`` on the real broker, with a stand-in socket."""

from __future__ import annotations

from typing import Any

from oasst_inference_server.broker.worker_session import WorkerSession
from oasst_shared.protocol import Pong
from tests.support.api import API
from tests.support.worker_socket import StandInSocket, stand_in_connection

pytestmark = API


class CountedWrites:
    """The app's broker, its session writes counted."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker
        self.writes: list[WorkerSession] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)

    async def put_worker_session(self, record: Any, ttl: float) -> None:
        self.writes.append(WorkerSession.of(record))  # type: ignore[arg-type]
        await self._broker.put_worker_session(record, ttl)


class StubDispatcher:
    def capacity_changed(self) -> None:
        pass


async def test_pongs_write_the_session_only_when_it_changed_or_is_due(app) -> None:
    connection = stand_in_connection(app, "pong-model", StandInSocket(), StubDispatcher(), slots=2)
    broker = connection._broker = CountedWrites(app.state.broker)  # type: ignore[assignment]
    try:
        await connection._publish_session()  # as on connect
        for n in range(5):
            await connection._on_pong(Pong(ping_id=f"p{n}", free_slots=2))
        assert len(broker.writes) == 1  # five pongs that told nothing new

        await connection._on_pong(Pong(ping_id="busy", free_slots=1))  # the worker is busier
        await connection._on_pong(Pong(ping_id="sick", free_slots=1, backend_healthy=False))
        await connection._on_pong(Pong(ping_id="sick again", free_slots=1, backend_healthy=False))
        assert [(w.free_slots, w.backend_healthy) for w in broker.writes[1:]] == [(1, True), (0, False)]

        # Half the TTL (twice the ping timeout) later, the same pong refreshes the record.
        connection._published_at -= app.state.settings.worker_ping_timeout
        await connection._on_pong(Pong(ping_id="late", free_slots=1, backend_healthy=False))
        assert len(broker.writes) == 4
        await connection._on_pong(Pong(ping_id="later", free_slots=1, backend_healthy=False))
        assert len(broker.writes) == 4
    finally:
        await app.state.broker.remove_worker_session(connection.session_id)


async def test_a_pong_writes_again_a_session_that_redis_lost(app) -> None:
    """Redis flushed (or restarted empty) between two writes: the next read of the sessions misses this
    process's session, and the next pong writes it again although nothing changed; then pongs go quiet."""
    broker = app.state.broker
    connection = stand_in_connection(app, "pong-lost", StandInSocket(), StubDispatcher(), slots=2)
    counted = connection._broker = CountedWrites(broker)  # type: ignore[assignment]
    try:
        await connection._publish_session()
        await connection._on_pong(Pong(ping_id="p0", free_slots=2))
        assert len(counted.writes) == 1
        # As FLUSHALL does to it, behind the server's back.
        await broker._client.delete(broker.keys.session(connection.session_id))
        await broker._client.zrem(broker.keys.session_index, connection.session_id)
        view = app.state.registry.sessions
        assert connection.session_id not in (await view.snapshot(fresh=True)).sessions
        await connection._on_pong(Pong(ping_id="p1", free_slots=2))
        assert len(counted.writes) == 2
        assert connection.session_id in (await view.snapshot(fresh=True)).sessions
        await connection._on_pong(Pong(ping_id="p2", free_slots=2))
        assert len(counted.writes) == 2
    finally:
        await broker.remove_worker_session(connection.session_id)
