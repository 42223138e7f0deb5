"""More requests at once than the database pool has connections, on Postgres and Redis: a request gives its
connection back once it is authenticated, and the aliases' view is read once for every request of a
moment, so none of them waits for a connection that another waiting request holds.

Before, a request's session kept the connection of its authentication's read to its end, and each
request then read the aliases on a session of its own, one after another: with as many requests as the
pool has connections, each held one and waited for another until the pool's timeout failed them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings
from tests.support.api import API, sign_in
from tests.support.sql_statements import recorded_statements

pytestmark = API

POOL = 1  # one connection and one overflow
AT_ONCE = 8


@pytest_asyncio.fixture(loop_scope="session")
async def small_pool(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """A replica of its own (an empty user cache, an alias view never read) with a pool of two."""
    replica = create_app(settings.model_copy(update={"database_pool_size": POOL}))
    async with LifespanManager(replica, startup_timeout=60, shutdown_timeout=30):
        transport = httpx.ASGITransport(app=replica)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield replica, http


async def test_more_requests_than_connections_all_answered(client, small_pool) -> None:
    replica, http = small_pool
    # Users the replica has never seen: each request reads its user, then the aliases.
    users = [await sign_in(client) for _ in range(AT_ONCE)]
    with recorded_statements(replica) as statements:
        async with asyncio.timeout(20):  # the pool's own timeout is 30 s: a deadlock fails here first
            responses = await asyncio.gather(*(http.get("/v1/models", headers=u.headers) for u in users))
    assert [r.status_code for r in responses] == [200] * AT_ONCE, [r.text for r in responses]
    alias_reads = [s for s in statements if s.upper().startswith("SELECT") and "model_alias" in s]
    assert len(alias_reads) == 1, alias_reads
