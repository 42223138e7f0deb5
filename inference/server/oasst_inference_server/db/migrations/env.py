"""Alembic environment for the inference server, async-aware.

Three ways in:

* the server on start (``upgrade_to_head``) hands over a synchronous connection of its own async
  engine in ``config.attributes["connection"]``;
* the ``alembic`` command line makes an async engine from ``OASST_SERVER_DATABASE_URL`` (or
  ``config.attributes["database_url"]``) and runs the migrations through ``run_sync``;
* ``alembic upgrade head --sql`` renders SQL offline.

SQLite cannot alter most columns in place, so it runs in batch mode (copy-and-move tables).
"""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlmodel import SQLModel

from oasst_inference_server.db import models  # noqa: F401 - registers every table on SQLModel.metadata
from oasst_inference_server.db.engine import normalise_database_url
from oasst_inference_server.db.migrations import compare_type, render_item

config = context.config
target_metadata = SQLModel.metadata


def _database_url() -> str:
    url = config.attributes.get("database_url")
    if not url:
        from oasst_inference_server.settings import Settings

        url = Settings().database_url
    return normalise_database_url(str(url))


def _configure(**options: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        compare_type=compare_type,
        render_item=render_item,
        **options,
    )


def _run_on(connection: Connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(_database_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_on)
    finally:
        await engine.dispose()


def run_offline() -> None:
    url = _database_url()
    _configure(url=url, literal_binds=True, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
    else:
        asyncio.run(_run_async())


if context.is_offline_mode():
    run_offline()
else:
    run_online()
