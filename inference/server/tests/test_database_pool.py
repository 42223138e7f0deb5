"""The Postgres connection pool hands out live connections: a pooled connection the server lost
(Postgres restarted, an administrator ended it) is found by the pre-ping and replaced."""

from __future__ import annotations

import pytest
from sqlalchemy import func
from sqlmodel import select

from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.settings import Settings
from tests.support.services import admin_sql, fresh_database

pytestmark = pytest.mark.postgres


async def test_a_pooled_connection_that_died_is_replaced_on_checkout() -> None:
    with fresh_database("oasst_pool") as url:
        engine = create_engine(Settings(database_url=url, environment="development"))
        sessions = make_session_factory(engine)
        try:
            async with sessions() as session:
                first = (await session.exec(select(func.pg_backend_pid()))).one()
            admin_sql(f"SELECT pg_terminate_backend({int(first)})")
            for _ in range(3):  # every checkout gets a working connection, none a dead one
                async with sessions() as session:
                    backend = (await session.exec(select(func.pg_backend_pid()))).one()
                assert backend != first
        finally:
            await engine.dispose()
