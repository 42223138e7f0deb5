"""Fixtures of the broker tests beyond the shared ones (``make_broker``, ``broker``: one level up): fresh
Redis key prefixes for the tests that build their own Redis brokers, and two replicas' brokers on one
deployment's keys.

The Redis runs use the local Redis (``OASST_TEST_REDIS_URL``, default redis://127.0.0.1:6379/0) under
a fresh random key prefix, and delete every key of that prefix afterwards. Deselect them with
``-m "not redis"`` where no Redis runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from oasst_inference_server.broker import RedisBroker
from tests.support.broker_prefixes import delete_prefix, new_prefix


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


@pytest.fixture
async def replicas(
    redis_url: str, redis_prefix: Callable[[], str]
) -> AsyncIterator[tuple[RedisBroker, RedisBroker]]:
    """Two replicas' brokers on one deployment's keys."""
    prefix = redis_prefix()
    brokers = (RedisBroker(redis_url, key_prefix=prefix), RedisBroker(redis_url, key_prefix=prefix))
    for broker in brokers:
        await broker.start()
    yield brokers
    for broker in brokers:
        await broker.close()
