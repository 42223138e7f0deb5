"""Fixtures of the broker tests beyond the shared ones (``make_broker``, ``broker``: one level up): fresh
Redis key prefixes for the tests that build their own Redis brokers.

The Redis runs use the local Redis (``OASST_TEST_REDIS_URL``, default redis://127.0.0.1:6379/0) under
a fresh random key prefix, and delete every key of that prefix afterwards. Deselect them with
``-m "not redis"`` where no Redis runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

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
