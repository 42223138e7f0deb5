"""Fixtures of the broker contract suite: every test runs against the in-memory and the Redis broker.

The Redis runs use the local Redis (``OASST_TEST_REDIS_URL``, default redis://127.0.0.1:6379/0) under
a fresh random key prefix, and delete every key of that prefix afterwards. Deselect them with
``-m "not redis"`` where no Redis runs.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from oasst_inference_server.broker import Broker, InMemoryBroker, RedisBroker
from oasst_inference_server.broker.keys import RedisKeys
from tests.support.services import REDIS_URL

BrokerFactory = Callable[..., Awaitable[Broker]]


def new_prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


async def delete_prefix(prefix: str) -> None:
    client: Any = aioredis.Redis.from_url(REDIS_URL)  # Any: types-redis 4.6 lacks aclose()
    try:
        keys = [key async for key in client.scan_iter(match=RedisKeys(prefix).pattern, count=500)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_broker(broker_kind: str) -> AsyncIterator[BrokerFactory]:
    """Builds started brokers of the current kind (options: stream_ttl, stream_maxlen, ...)."""
    created: list[Broker] = []
    prefixes: list[str] = []

    async def factory(**options: Any) -> Broker:
        broker: Broker
        if broker_kind == "memory":
            broker = InMemoryBroker(**options)
        else:
            prefix = options.pop("key_prefix", None) or new_prefix()
            prefixes.append(prefix)
            broker = RedisBroker(REDIS_URL, key_prefix=prefix, **options)
        created.append(broker)
        await broker.start()
        return broker

    yield factory
    for broker in created:
        await broker.close()
    for prefix in prefixes:
        await delete_prefix(prefix)


@pytest.fixture
async def broker(make_broker: BrokerFactory) -> Broker:
    return await make_broker()


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
async def redis_prefix() -> AsyncIterator[Callable[[], str]]:
    """Hands out fresh key prefixes and deletes their keys afterwards."""
    prefixes: list[str] = []

    def factory() -> str:
        prefixes.append(new_prefix())
        return prefixes[-1]

    yield factory
    for prefix in prefixes:
        await delete_prefix(prefix)
