"""The local Postgres and Redis: throwaway databases and key prefixes, removed afterwards.

``OASST_TEST_POSTGRES`` (an admin DSN) and ``OASST_TEST_REDIS_URL`` point the tests and benchmarks at other
servers than the defaults.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import uuid
from collections.abc import Iterator

POSTGRES_ADMIN_DSN = os.environ.get("OASST_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("OASST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_ADMIN_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def admin_sql(sql: str) -> None:
    # In a thread of its own, so callers that run inside an event loop (benchmarks) can use it too.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _admin(sql)).result()


def create_database(prefix: str = "oasst_test") -> str:
    """Create an empty Postgres database and return its asyncpg URL (drop it with drop_database)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin_sql(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{name}".replace("postgresql://", "postgresql+asyncpg://", 1)


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh_database(prefix: str = "oasst_test") -> Iterator[str]:
    """An empty Postgres database for the ``with`` block, dropped afterwards."""
    url = create_database(prefix)
    try:
        yield url
    finally:
        drop_database(url)


def delete_redis_prefix(prefix: str) -> None:
    """Delete every key under ``prefix`` in the local Redis."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@contextlib.contextmanager
def fresh_redis_prefix(tag: str = "test") -> Iterator[str]:
    """A new Redis key prefix for the ``with`` block; every key under it is deleted afterwards."""
    prefix = f"{tag}:{uuid.uuid4().hex[:10]}:"
    try:
        yield prefix
    finally:
        delete_redis_prefix(prefix)
