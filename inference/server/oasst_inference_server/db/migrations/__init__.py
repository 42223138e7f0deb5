"""Database migrations (Alembic) and the upgrade the server runs on start.

``upgrade_to_head`` waits for the database to answer (it may still be starting, e.g. in
docker compose), then upgrades it to the newest revision. Replicas starting together on one Postgres
take turns through an advisory lock, so each revision runs once. A database created before the
project had migrations (tables but no ``alembic_version``) is stamped at the first revision, which
is exactly that schema, and then upgraded.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from loguru import logger
from sqlalchemy import inspect, text
from sqlalchemy import types as satypes
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlmodel.sql.sqltypes import AutoString, UTCDateTime

MIGRATIONS_DIR = Path(__file__).resolve().parent
INITIAL_REVISION = "0001"
# pg_advisory_xact_lock key shared by every replica ("oasst" in ASCII).
_LOCK_KEY = 0x6F61737374


class DatabaseUnavailable(RuntimeError):
    """The database did not answer within the start-up timeout."""


def alembic_config(database_url: str | None = None) -> Config:
    """An Alembic config pointing at these migrations (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        # An attribute, not a main option: ``%`` in a password would break ini interpolation.
        config.attributes["database_url"] = database_url
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    """Autogenerate hook: spell SQLModel's column types as plain SQLAlchemy ones in new revisions."""
    if type_ == "type" and isinstance(obj, AutoString):
        length = getattr(obj.impl, "length", None)
        return f"sa.String(length={length})" if length else "sa.String()"
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def compare_type(
    _context: Any, _inspected: Any, _metadata: Any, inspected_type: Any, metadata_type: Any
) -> bool | None:
    """Autogenerate hook: UTCDateTime decorates DateTime(timezone=True), so compare what it stores."""
    if isinstance(metadata_type, UTCDateTime):
        if not isinstance(inspected_type, satypes.DateTime):
            return True
        # SQLite has no time zone type: it stores UTC text, so a plain DATETIME matches.
        return _context.dialect.name != "sqlite" and not inspected_type.timezone
    return None  # the default comparison


async def wait_for_database(engine: AsyncEngine, timeout: float) -> None:
    """Retry connecting until the database answers or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    delay = 0.25
    while True:
        try:
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return
        except Exception as exc:  # any driver error while the database is starting means "not yet"
            if time.monotonic() >= deadline:
                raise DatabaseUnavailable(
                    f"the database at {engine.url.render_as_string(hide_password=True)} did not answer "
                    f"within {timeout:.0f}s: {type(exc).__name__}: {exc}"
                ) from exc
            logger.warning("database not ready ({}); retrying in {:.1f}s", type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 3.0)


async def upgrade_to_head(engine: AsyncEngine, *, startup_timeout: float = 60.0) -> str:
    """Bring the database to the newest revision; returns that revision."""
    await wait_for_database(engine, startup_timeout)
    async with engine.begin() as conn:
        revision = await conn.run_sync(_upgrade_locked)
    logger.info("database at revision {} ({})", revision, engine.url.render_as_string(hide_password=True))
    return revision


def _upgrade_locked(connection: Connection) -> str:
    if connection.dialect.name == "postgresql":
        # Held until this transaction ends: a second replica waits here, then finds head.
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
    config = alembic_config()
    config.attributes["connection"] = connection
    tables = set(inspect(connection).get_table_names())
    if "alembic_version" not in tables and "message" in tables:
        logger.info("database predates migrations: stamping revision {}", INITIAL_REVISION)
        command.stamp(config, INITIAL_REVISION)
    command.upgrade(config, "head")
    current = MigrationContext.configure(connection).get_current_revision()
    return current or "base"
