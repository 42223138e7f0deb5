"""The token relay: batches under load, keeps order, flushes before terminal events, pushes back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from oasst_inference_server import events
from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.workers.token_relay import TokenRelay


class GatedBroker:
    """Wraps a broker; ``append_events`` waits for the gate and can be told to fail."""

    def __init__(self, inner: Broker) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False
        self.batches: list[int] = []

    async def append_events(self, entries: list[tuple[str, str]]) -> None:
        await self.gate.wait()
        self.batches.append(len(entries))
        if self.fail:
            raise BrokerError("redis XADD batch failed: ConnectionError")
        await self.inner.append_events(entries)


@pytest.fixture
async def gated(broker: Broker) -> GatedBroker:
    return GatedBroker(broker)


@pytest.fixture
async def relay(gated: GatedBroker) -> AsyncIterator[TokenRelay]:
    relay = TokenRelay(gated, max_pending=8)  # type: ignore[arg-type]
    task = asyncio.create_task(relay.run())
    yield relay
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def texts(broker: Broker, message_id: str) -> list[str]:
    entries = await broker.read_events(events.stream_name(message_id), None, timeout=0, count=1000)
    return [json.loads(e.data)["text"] for e in entries]


async def test_tokens_written_while_a_write_is_in_flight_go_in_one_batch(
    broker: Broker, gated: GatedBroker, relay: TokenRelay
) -> None:
    gated.gate.clear()
    await relay.add("m1", "a")
    await asyncio.sleep(0.05)  # the writer took "a" and waits at the gate
    for text in ["b", "c", "d"]:
        await relay.add("m1", text)
    await relay.add("m2", "x")
    gated.gate.set()
    await asyncio.wait_for(relay.flush(), 5)
    assert gated.batches == [1, 4]
    assert await texts(broker, "m1") == ["a", "b", "c", "d"]
    assert await texts(broker, "m2") == ["x"]


async def test_a_lone_token_is_written_at_once(broker: Broker, gated: GatedBroker, relay: TokenRelay) -> None:
    await relay.add("m1", "only")
    await asyncio.wait_for(relay.flush(), 5)
    assert gated.batches == [1]
    assert await texts(broker, "m1") == ["only"]


async def test_flush_waits_for_the_write_in_flight(gated: GatedBroker, relay: TokenRelay) -> None:
    gated.gate.clear()
    await relay.add("m1", "a")
    flushed = asyncio.create_task(relay.flush())
    await asyncio.sleep(0.1)
    assert not flushed.done()
    gated.gate.set()
    await asyncio.wait_for(flushed, 5)


async def test_a_full_backlog_makes_add_wait(gated: GatedBroker, relay: TokenRelay) -> None:
    gated.gate.clear()
    await relay.add("m1", "first")
    await asyncio.sleep(0.05)  # in flight, not pending
    for i in range(8):
        await relay.add("m1", str(i))
    blocked = asyncio.create_task(relay.add("m1", "ninth"))
    await asyncio.sleep(0.1)
    assert not blocked.done()  # the connection stops reading the worker's socket here
    gated.gate.set()
    await asyncio.wait_for(blocked, 5)
    await asyncio.wait_for(relay.flush(), 5)
    assert sum(gated.batches) == 10


async def test_a_broker_error_loses_that_batch_only(
    broker: Broker, gated: GatedBroker, relay: TokenRelay
) -> None:
    gated.fail = True
    await relay.add("m1", "lost")
    await asyncio.wait_for(relay.flush(), 5)
    assert relay.lost == 1
    gated.fail = False
    await relay.add("m1", "kept")
    await asyncio.wait_for(relay.flush(), 5)
    assert await texts(broker, "m1") == ["kept"]


def test_max_pending_must_be_positive(broker: Broker) -> None:
    with pytest.raises(ValueError, match="max_pending"):
        TokenRelay(broker, max_pending=0)
