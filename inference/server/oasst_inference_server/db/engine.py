"""The async database engine and sessions, on SQLite (aiosqlite) or Postgres (asyncpg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Integer, event, literal_column
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.util import await_
from sqlmodel import select
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.db import models  # noqa: F401 - registers the tables
from oasst_inference_server.settings import Settings


def normalise_database_url(url: str) -> str:
    """Accept plain ``postgresql://`` and ``sqlite://`` URLs and pick the async drivers."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+asyncpg://" + url[len("postgresql://") :]
    if url.startswith("sqlite://"):
        url = "sqlite+aiosqlite://" + url[len("sqlite://") :]
    return url


def create_engine(settings: Settings) -> AsyncEngine:
    url = make_url(normalise_database_url(settings.database_url))
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):
            # WAL lets the SSE readers read while a worker's result is written.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

        return engine
    engine = create_async_engine(
        url,
        pool_size=settings.database_pool_size,
        max_overflow=settings.database_pool_size,
        pool_pre_ping=True,
    )
    engine.dialect.do_ping = _ping_once  # type: ignore[method-assign]
    return engine


def _ping_once(dbapi_connection: Any) -> bool:
    """The pool's pre-ping in one round trip: ``SELECT 1`` as a simple-protocol query.

    SQLAlchemy's asyncpg ping wraps its query in BEGIN ... ROLLBACK (three round trips on every
    checkout, so that its prepared statement suits pgbouncer's transaction mode); a simple-protocol
    query prepares nothing and needs no transaction. False (the connection is gone) makes the pool
    invalidate its connections and connect afresh, as on any failed pre-ping.
    """
    try:
        await_(dbapi_connection.driver_connection.execute("SELECT 1"))
    except Exception:
        return False
    return True


def make_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)


async def ping_database(session: AsyncSession) -> None:
    """Run a trivial query; raises whatever the driver raises when the database does not answer."""
    await session.exec(select(literal_column("1", Integer)))  # SELECT 1
