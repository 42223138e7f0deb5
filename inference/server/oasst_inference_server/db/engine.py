"""The async database engine and sessions, on SQLite (aiosqlite) or Postgres (asyncpg)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Integer, event, literal_column
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
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


def create_engine(
    settings: Settings, *, connections: int | None = None, pool_timeout: float = 30.0
) -> AsyncEngine:
    """The engine of ``settings.database_url``: a pool of ``database_pool_size`` connections and as many
    overflow ones, or exactly ``connections`` (none overflow) for a pool of its own, on Postgres; a
    checkout waits at most ``pool_timeout`` seconds for a connection."""
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
        pool_size=connections or settings.database_pool_size,
        max_overflow=0 if connections else settings.database_pool_size,
        pool_timeout=pool_timeout,
        # No "SELECT 1" round trip per checkout (pre-ping): see _skip_closed_connections.
        pool_pre_ping=False,
    )
    event.listen(engine.sync_engine, "checkout", _skip_closed_connections)
    return engine


def _skip_closed_connections(dbapi_connection, _record, _proxy) -> None:
    """Refuse a pooled connection whose socket is already closed, at no cost: a Postgres restart closes
    every connection, asyncpg notices the closed socket on its own, and the pool then opens a fresh one
    in its place instead of failing the request. A connection that dies silently (no FIN: a network
    partition) still fails its first statement; SQLAlchemy sees a disconnect error there and
    invalidates the whole pool, so the next requests get fresh connections."""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the database closed this connection")


def make_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)


async def end_read(session: AsyncSession) -> None:
    """End ``session``'s transaction if it has only read: its connection goes back to the pool, and what it
    read stays loaded (these sessions do not expire objects on commit); the next statement takes a
    connection again. For a request's session before it does what needs no database, or opens a
    session of its own: a request that holds one connection while it waits for another deadlocks
    the pool once as many requests as it has connections do so at once."""
    if session.in_transaction() and not (session.new or session.dirty or session.deleted):
        await session.commit()


async def ping_database(session: AsyncSession) -> None:
    """Run a trivial query; raises whatever the driver raises when the database does not answer."""
    await session.exec(select(literal_column("1", Integer)))  # SELECT 1
