"""The hottest statements straight on asyncpg, on connections of SQLAlchemy's pool (Postgres only).

A statement through the ORM session costs the server some 0.8-1.2 ms of CPU, nearly all of it
SQLAlchemy's own Python (``bench/sql_layer``, docs/performance.md section 7c); the same statement on the
asyncpg connection under the pool costs a quarter of that. Every answer pays a few of these statements,
so the few that every answer runs (its end, the scrub of a ``/v1`` request) are written here in SQL,
and everything else keeps the ORM. On SQLite there is no driver path (:func:`driver_connections` gives
None) and the callers use the ORM statements, which mean the same.

A connection is taken from the engine's pool and given back to it, so the pool's bound, its checkout
events and its disconnect handling apply as to any other statement. Each statement here is one
autocommitted statement (no transaction is opened on the connection), so what goes back to the pool is
a connection with nothing open. A connection that fails other than by a statement's own error (a lost
socket, a cancelled wait) is invalidated, not reused.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy import JSON
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from oasst_inference_server.db.models import DbMessage, StoredEnum

_COLUMNS = DbMessage.__table__.columns
# The message table's JSON columns (asyncpg hands them over as text) and enum ones (as their values).
_JSON_COLUMNS = tuple(column.name for column in _COLUMNS if isinstance(column.type, JSON))
_ENUM_COLUMNS = tuple(
    (column.name, column.type.enum_type) for column in _COLUMNS if isinstance(column.type, StoredEnum)
)


class DriverConnections:
    """Connections of ``engine``'s pool, as asyncpg connections."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        pooled = await self._engine.raw_connection()
        try:
            driver = pooled.driver_connection
            assert driver is not None
            yield driver
        except asyncpg.PostgresError:
            # The statement's own error (a constraint, a type): the connection is as good as before.
            await greenlet_spawn(pooled.close)
            raise
        except BaseException as exc:
            # Anything else may leave the connection mid-statement: it does not go back to the pool.
            await greenlet_spawn(pooled.invalidate, exc if isinstance(exc, Exception) else None)
            raise
        else:
            await greenlet_spawn(pooled.close)


def driver_connections(engine: AsyncEngine) -> DriverConnections | None:
    """The driver path of ``engine``, or None where it has none (SQLite)."""
    return DriverConnections(engine) if engine.dialect.name == "postgresql" else None


def sql_values(values: Iterable[enum.Enum]) -> str:
    """Enum values as a SQL list (``'a', 'b'``), for the statements' fixed ``IN (...)``: the code's own
    values, never a caller's."""
    return ", ".join(f"'{value.value}'" for value in values)


def stored_json(value: Any) -> str | None:
    """A JSON column's value as the ORM writes it (``json.dumps``); None stays SQL NULL."""
    return None if value is None else json.dumps(value)


def message_from_row(row: Mapping[str, Any]) -> DbMessage:
    """A ``message`` row of asyncpg's (``RETURNING *``) as the ORM would load it: enums as enums, JSON
    columns parsed. Not attached to any session: for reading only."""
    values = dict(row)
    for name in _JSON_COLUMNS:
        if isinstance(values.get(name), str):
            values[name] = json.loads(values[name])
    for name, kind in _ENUM_COLUMNS:
        if values.get(name) is not None:
            values[name] = kind(values[name])
    return DbMessage.model_construct(**values)
