"""Alembic migrations: from empty, from the previous revision, down one step and back, a database
from before migrations, concurrent replicas, and the models agreeing with the migrations.

Postgres runs use a database of their own per test (created and dropped here); SQLite runs use a file
in the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlmodel import SQLModel

from oasst_inference_server.db import models  # noqa: F401 - registers the tables
from oasst_inference_server.db.migrations import (
    INITIAL_REVISION,
    DatabaseUnavailable,
    alembic_config,
    compare_type,
    head_revision,
    render_item,
    upgrade_to_head,
    wait_for_database,
)
from tests.support.processes import free_port
from tests.support.services import fresh_database

SERVER_DIR = Path(__file__).resolve().parents[2]
REVISIONS = [
    s.revision for s in reversed(list(ScriptDirectory.from_config(alembic_config()).walk_revisions()))
]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path}/migrations.db"
        return
    with fresh_database("oasst_mig") as url:
        yield url


async def alembic(engine: AsyncEngine, action: Callable[..., Any], *args: Any) -> None:
    """Run an alembic command on one of the engine's connections."""

    def run(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        action(config, *args)

    async with engine.begin() as conn:
        await conn.run_sync(run)


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())


async def table_names(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


async def schema_diff(engine: AsyncEngine) -> list[Any]:
    def diff(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(
            connection, opts={"compare_type": compare_type, "render_item": render_item}
        )
        return list(compare_metadata(context, SQLModel.metadata))

    async with engine.connect() as conn:
        return await conn.run_sync(diff)


def test_revisions_form_one_line():
    assert REVISIONS[0] == INITIAL_REVISION and REVISIONS[-1] == head_revision()
    assert len(REVISIONS) >= 2 and len(set(REVISIONS)) == len(REVISIONS)


async def test_upgrade_from_empty(database_url):
    engine = create_async_engine(database_url)
    try:
        assert await upgrade_to_head(engine) == head_revision()
        assert await table_names(engine) == set(SQLModel.metadata.tables) | {"alembic_version"}
        diff = await schema_diff(engine)
        assert diff == [], f"run `alembic revision --autogenerate`; the models differ: {diff}"
        # Running it again (another replica, a restart) changes nothing.
        assert await upgrade_to_head(engine) == head_revision()
    finally:
        await engine.dispose()


async def test_upgrade_from_each_previous_revision_keeps_the_data(database_url):
    engine = create_async_engine(database_url)
    try:
        await alembic(engine, command.upgrade, INITIAL_REVISION)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    'INSERT INTO "user" (id, provider, provider_account_id, display_name, created_at, deleted) '
                    "VALUES ('u1', 'debug', 'ada', 'Ada', CURRENT_TIMESTAMP, false)"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO chat (id, user_id, created_at, modified_at, hidden, allow_data_use) "
                    "VALUES ('c1', 'u1', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, false, true)"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO message (id, kind, chat_id, role, content, state, created_at, attempts, "
                    "cancel_requested) VALUES ('m1', 'chat', 'c1', 'prompter', 'hi', 'manual', CURRENT_TIMESTAMP, 0, false)"
                )
            )
        for revision in REVISIONS[1:]:
            await alembic(engine, command.upgrade, revision)
            assert await current_revision(engine) == revision
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT content, score FROM message WHERE id = 'm1'"))).one()
            assert tuple(row) == ("hi", 0)  # the new column got its default on old rows
        assert await schema_diff(engine) == []
    finally:
        await engine.dispose()


async def test_downgrade_one_step_and_back(database_url):
    engine = create_async_engine(database_url)
    try:
        await upgrade_to_head(engine)
        for _ in range(len(REVISIONS) - 1):
            before = await current_revision(engine)
            await alembic(engine, command.downgrade, "-1")
            after = await current_revision(engine)
            assert after == REVISIONS[REVISIONS.index(before) - 1]
        await alembic(engine, command.downgrade, "base")
        assert await table_names(engine) <= {"alembic_version"}
        await upgrade_to_head(engine)
        assert await current_revision(engine) == head_revision()
        assert await schema_diff(engine) == []
    finally:
        await engine.dispose()


async def test_a_database_from_before_migrations_is_stamped_and_upgraded(database_url):
    engine = create_async_engine(database_url)
    try:
        # What `create_all` of the first release left: its tables, no alembic_version.
        await alembic(engine, command.upgrade, INITIAL_REVISION)
        async with engine.begin() as conn:
            await conn.execute(text("DROP TABLE alembic_version"))
        assert await upgrade_to_head(engine) == head_revision()
        assert await schema_diff(engine) == []
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_replicas_starting_together_upgrade_once():
    with fresh_database("oasst_mig") as url:
        engines = [create_async_engine(url) for _ in range(3)]
        try:
            revisions = await asyncio.gather(*(upgrade_to_head(e) for e in engines))
            assert revisions == [head_revision()] * 3
            assert await schema_diff(engines[0]) == []
        finally:
            for engine in engines:
                await engine.dispose()


async def test_waiting_for_a_database_that_never_comes():
    engine = create_async_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/none")
    try:
        with pytest.raises(DatabaseUnavailable, match="did not answer"):
            await wait_for_database(engine, timeout=1.0)
    finally:
        await engine.dispose()


@pytest.mark.postgres
def test_the_alembic_command_line(tmp_path):
    """`alembic upgrade head` from inference/server/ with the server's environment variable."""
    with fresh_database("oasst_cli") as url:
        env = {**os.environ, "OASST_SERVER_DATABASE_URL": url}
        alembic_bin = [sys.executable, "-m", "alembic"]
        for args in (["upgrade", "head"], ["current"], ["check"]):
            done = subprocess.run(
                [*alembic_bin, *args], cwd=SERVER_DIR, env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
            if args == ["current"]:
                assert head_revision() in done.stdout
        offline = subprocess.run(
            [*alembic_bin, "upgrade", "head", "--sql"],
            cwd=SERVER_DIR,
            env=env,
            capture_output=True,
            text=True,
        )
        assert offline.returncode == 0 and "CREATE TABLE refresh_token" in offline.stdout
