"""The Postgres connection pool hands out live connections: a pooled connection that Postgres closed
(a restart, an administrator ending it) is replaced at checkout instead of failing a request."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func
from sqlmodel import select

from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.settings import Settings
from tests.support.services import admin_sql, fresh_database

pytestmark = pytest.mark.postgres


async def test_a_pooled_connection_that_postgres_closed_is_replaced_on_checkout() -> None:
    with fresh_database("oasst_pool") as url:
        engine = create_engine(Settings(database_url=url, environment="development"))
        sessions = make_session_factory(engine)
        try:
            async with sessions() as session:
                first = (await session.exec(select(func.pg_backend_pid()))).one()
            admin_sql(f"SELECT pg_terminate_backend({int(first)})")
            await asyncio.sleep(
                0.2
            )  # the event loop reads the closed socket, as it would long before a request
            for _ in range(3):  # every checkout gets a working connection, none the closed one
                async with sessions() as session:
                    backend = (await session.exec(select(func.pg_backend_pid()))).one()
                assert backend != first
        finally:
            await engine.dispose()
