"""The driver path (``db.driver``): statements straight on asyncpg, on connections of SQLAlchemy's pool.

A connection Postgres closed is replaced at checkout as on the ORM path; a connection left mid-statement
(a cancelled wait) never goes back to the pool; a statement's own error leaves its connection usable;
and a row read this way is the message the ORM reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel import SQLModel

from oasst_inference_server.db.driver import DriverConnections, driver_connections, message_from_row
from oasst_inference_server.db.engine import create_engine, make_session_factory
from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import MessageState, Role
from tests.support.services import admin_sql, fresh_database

pytestmark = pytest.mark.postgres


@asynccontextmanager
async def own_engine() -> AsyncIterator[AsyncEngine]:
    with fresh_database("oasst_driver") as url:
        engine = create_engine(Settings(database_url=url, environment="development"), connections=2)
        async with engine.begin() as connection:
            await connection.run_sync(SQLModel.metadata.create_all)
        try:
            yield engine
        finally:
            await engine.dispose()


async def backend_pid(driver: DriverConnections) -> int:
    async with driver.connection() as connection:
        return int(await connection.fetchval("SELECT pg_backend_pid()"))


async def test_sqlite_has_no_driver_path(tmp_path) -> None:
    engine = create_engine(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path}/x.db", environment="development")
    )
    try:
        assert driver_connections(engine) is None
    finally:
        await engine.dispose()


async def test_a_connection_postgres_closed_is_replaced_on_checkout() -> None:
    async with own_engine() as engine:
        driver = driver_connections(engine)
        assert driver is not None
        first = await backend_pid(driver)
        admin_sql(f"SELECT pg_terminate_backend({first})")
        await asyncio.sleep(0.2)  # the event loop reads the closed socket
        for _ in range(3):
            assert await backend_pid(driver) != first


async def test_a_statement_s_own_error_keeps_its_connection() -> None:
    async with own_engine() as engine:
        driver = driver_connections(engine)
        assert driver is not None
        first = await backend_pid(driver)
        with pytest.raises(asyncpg.UndefinedTableError):
            async with driver.connection() as connection:
                await connection.execute("SELECT * FROM no_such_table")
        # Both pooled connections are the ones there were: none was dropped for the statement's error.
        assert first in {await backend_pid(driver) for _ in range(2)}


async def test_a_connection_left_mid_statement_is_not_reused() -> None:
    async with own_engine() as engine:
        driver = driver_connections(engine)
        assert driver is not None
        started = asyncio.Event()
        pids: list[int] = []

        async def slow() -> None:
            async with driver.connection() as connection:
                pids.append(int(await connection.fetchval("SELECT pg_backend_pid()")))
                started.set()
                await connection.execute("SELECT pg_sleep(5)")

        task = asyncio.create_task(slow())
        await started.wait()
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Every connection handed out afterwards answers at once, and none is the cancelled one.
        after = [await asyncio.wait_for(backend_pid(driver), 2) for _ in range(4)]
        assert pids[0] not in after


async def test_a_row_read_by_the_driver_is_the_message_the_orm_reads() -> None:
    async with own_engine() as engine:
        sessions = make_session_factory(engine)
        stored = DbMessage(
            kind=MessageKind.completion,
            role=Role.assistant,
            state=MessageState.complete,
            content="hello",
            sampling_parameters={"temperature": 0.5, "stop": ["\n"]},
            result_payload={"tool_calls": [{"id": "call_1"}]},
            generated_tokens=3,
        )
        async with sessions() as session:
            session.add(stored)
            await session.commit()
            orm = await session.get(DbMessage, stored.id)
        driver = driver_connections(engine)
        assert driver is not None and orm is not None
        async with driver.connection() as connection:
            row = await connection.fetchrow("SELECT * FROM message WHERE id = $1", stored.id)
        read = message_from_row(row)
        assert read.model_dump() == orm.model_dump()
        assert (type(read.state), type(read.kind), type(read.role)) == (MessageState, MessageKind, Role)
