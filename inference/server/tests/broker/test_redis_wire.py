"""The bare Redis connection of the per-token commands (broker/redis_wire.py), the XREAD it sends
(broker/xread_command.py), and the broker's append over it: replies, errors, timeouts, and the
fallback to redis-py that keeps every event exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import hiredis
import pytest
import uvloop

from oasst_inference_server import events
from oasst_inference_server.broker import BrokerError, RedisBroker
from oasst_inference_server.broker.keys import RedisKeys, parse_stream_id
from oasst_inference_server.broker.redis_wire import (
    RespWire,
    WireClosed,
    WireReplyError,
    WireTimeout,
    wire_for,
)
from oasst_inference_server.broker.xread_command import XreadCommand
from oasst_inference_server.streams.fanout import StreamFanout

pytestmark = pytest.mark.redis

Prefixes = Callable[[], str]


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A TCP server that reads what it is sent and never answers: a Redis that hangs."""

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while await reader.read(4096):
                pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_the_packed_xread_is_what_hiredis_packs_as_positions_move_and_streams_change() -> None:
    keys = RedisKeys("p:")
    command = XreadCommand(keys)
    after: dict[str, str | None] = {"a": None, "b": "5-1"}
    for _ in range(3):
        for block in (None, 250):
            args: list[str | int] = ["XREAD", "COUNT", 7]
            if block is not None:
                args += ["BLOCK", block]
            args += ["STREAMS", *(keys.stream(s) for s in after)]
            args += ["0-0" if p is None else str(parse_stream_id(p)) for p in after.values()]
            assert command.pack(after, 7, block) == hiredis.pack_command(tuple(args))
        after = {**after, "b": "6-0", "c": "7"} if "c" not in after else {"c": "8-2"}
    assert command.stream_of_key[keys.stream("c")] == "c"
    with pytest.raises(ValueError):
        command.pack({"a": "$"}, 1, None)


def test_only_plain_redis_urls_get_a_wire() -> None:
    def made(url: str) -> bool:
        return wire_for(url, timeout=1, connect_timeout=1, client_name=None) is not None

    assert made("redis://127.0.0.1:6379/0") and made("redis://user:pw@host/3") and made("redis://host")
    assert not made("rediss://host:6379/0")  # TLS: redis-py
    assert not made("unix:///tmp/redis.sock")
    assert not made("redis://host:6379/0?socket_timeout=3")
    assert not made("redis://host:6379/db")


async def test_replies_come_to_their_callers_in_order_and_errors_as_reply_errors(
    redis_url: str, redis_prefix: Prefixes
) -> None:
    key = f"{redis_prefix()}wire"
    wire = RespWire(redis_url, timeout=5, connect_timeout=5)
    try:
        replies = await asyncio.gather(*(wire.call("RPUSH", key, f"é{i}") for i in range(50)))
        assert replies == list(range(1, 51))
        assert await wire.call("LRANGE", key, 0, 1) == ["é0", "é1"]  # decoded strings
        with pytest.raises(WireReplyError, match="WRONGTYPE"):
            await wire.call("XADD", key, "*", "data", "x")
        assert await wire.call("LLEN", key) == 50  # the connection goes on after an error reply
    finally:
        await wire.close()
    with pytest.raises(WireClosed):
        await wire.call("PING")


def test_the_wire_runs_on_uvloop(redis_url: str) -> None:
    async def ping() -> object:
        wire = RespWire(redis_url, timeout=5, connect_timeout=5)
        try:
            return await wire.call("PING")
        finally:
            await wire.close()

    assert uvloop.run(ping()) == "PONG"


async def test_a_redis_that_does_not_answer_fails_every_waiting_call_and_the_next_connects_again(
    redis_url: str,
) -> None:
    async with silent_server() as url:
        wire = RespWire(url, timeout=0.2, connect_timeout=5)
        try:
            results = await asyncio.gather(wire.call("PING"), wire.call("PING"), return_exceptions=True)
            assert all(isinstance(r, WireTimeout) for r in results)
            with pytest.raises(WireClosed):
                await wire.call("PING", reconnect=False)
            assert wire.connections == 1
            with pytest.raises(WireTimeout):
                await wire.call("PING")
            assert wire.connections == 2
        finally:
            await wire.close()
    with pytest.raises(WireClosed, match="cannot connect"):
        await RespWire(closed_port_url(), timeout=1, connect_timeout=1).call("PING")


@pytest.fixture
async def broker(redis_url: str, redis_prefix: Prefixes) -> AsyncIterator[RedisBroker]:
    broker = RedisBroker(redis_url, key_prefix=redis_prefix())
    await broker.start()
    yield broker
    await broker.close()


async def stored(broker: RedisBroker, stream: str) -> list[str]:
    return [e.data for e in await broker.read_events(stream, None, timeout=0)]


async def test_appends_go_over_the_wire_and_each_event_is_stored_once(broker: RedisBroker) -> None:
    assert broker._wire is not None
    await broker.append_events([("s1", "a"), ("s2", "x"), ("s1", "b")])
    assert await stored(broker, "s1") == ["a", "b"] and await stored(broker, "s2") == ["x"]
    assert broker._wire.connections == 1


async def test_a_script_redis_lost_is_loaded_again_and_the_events_stored_once(broker: RedisBroker) -> None:
    real = broker._append_events.sha
    broker._append_events.sha = "0" * 40  # what Redis answers NOSCRIPT to, as after a SCRIPT FLUSH
    await broker.append_events([("s", "a"), ("s", "b")])
    assert await stored(broker, "s") == ["a", "b"]
    assert broker._append_events.sha == real  # redis-py loaded it again


async def test_an_unreachable_wire_falls_back_to_redis_py(broker: RedisBroker) -> None:
    broker._wire = RespWire(closed_port_url(), timeout=1, connect_timeout=1)
    await broker.append_events([("s", "a")])
    assert await stored(broker, "s") == ["a"]


async def test_an_append_that_timed_out_is_a_broker_error_and_never_sent_again(broker: RedisBroker) -> None:
    async with silent_server() as url:
        broker._wire = RespWire(url, timeout=0.2, connect_timeout=1)
        with pytest.raises(BrokerError, match="did not answer"):
            await broker.append_events([("s", "a")])
        await broker._wire.close()
    assert await stored(broker, "s") == []  # redis-py did not send it again: it may have run


async def test_a_streams_reader_whose_redis_hangs_raises_a_broker_error_and_reads_again_later(
    broker: RedisBroker,
) -> None:
    fanout = StreamFanout(broker)
    reader = fanout._reader
    real = reader._wire  # type: ignore[attr-defined]
    try:
        async with silent_server() as url:
            reader._wire = RespWire(url, timeout=0.2, connect_timeout=1)  # type: ignore[attr-defined]
            with pytest.raises(BrokerError, match="XREAD"):
                await reader.read({"s": None}, timeout=0.05)
            await reader._wire.close()  # type: ignore[attr-defined]
        reader._wire = real  # type: ignore[attr-defined]
        first = await broker.append_event("s", events.token_event(" a"))
        found = await reader.read({"s": None}, timeout=0.05)
        assert [e.id for e in found["s"]] == [first]
    finally:
        await fanout.close()
