"""Throwaway key prefixes of the broker tests on the local Redis, and deleting their keys."""

from __future__ import annotations

import uuid
from typing import Any

import redis.asyncio as aioredis

from oasst_inference_server.broker.keys import RedisKeys
from tests.support.services import REDIS_URL


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
