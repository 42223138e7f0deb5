"""Benchmark: what one database transaction costs the server's CPU, layer by layer.

At the model's pace the server's CPU per token is half per-request work, and the SQL layer is 39-44 % of the
server's samples (section 7b's profiles). This measures where that goes: the same two transactions of the
message lifecycle (a message read by id; an update that ends a message and returns its row, committed),
each N times in a row on one Postgres database, through

* the ORM session the server uses (``AsyncSession``, a session a transaction, as the lifecycle does);
* SQLAlchemy Core on a pooled connection (``engine.connect()``, a compiled cached statement);
* the asyncpg connection under SQLAlchemy's pool, called directly (prepared statements);
* a plain asyncpg connection.

Reported: the process's CPU per transaction (getrusage, user + system) and its ratio to plain asyncpg.
The database's own CPU is not counted (a separate process): this is the server's share.

    python -m bench.sql_layer              # full: 2,000 transactions of each kind a layer
    python -m bench.sql_layer --tiny       # CI: 50
"""

from __future__ import annotations

import argparse
import resource
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from sqlalchemy import bindparam, update
from sqlalchemy import select as core_select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlmodel import SQLModel, select

from bench.report import Report, Table, fmt_ratio, num
from bench.script import main_wrapper, parser
from oasst_inference_server.db.engine import make_session_factory
from oasst_inference_server.db.models import DbMessage
from tests.support.services import fresh_database

MESSAGES = 50  # rows the transactions cycle through
READ = "SELECT * FROM message WHERE id = $1"
END = "UPDATE message SET content = $2, state = 'complete' WHERE id = $1 RETURNING *"

Step = Callable[[int], Awaitable[object]]


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def per_call(step: Step, n: int) -> float:
    """CPU seconds per call of ``step``, after a few warm-up calls (connections, statement caches)."""
    for i in range(10):
        await step(i)
    started = cpu()
    for i in range(n):
        await step(i)
    return (cpu() - started) / n


async def driver_calls(connection: Any, pick: Callable[[int], str], n: int) -> tuple[float, float]:
    """(CPU per read, CPU per ending update) straight on an asyncpg connection."""

    async def end(i: int) -> object:
        async with connection.transaction():
            return await connection.fetchrow(END, pick(i), "y")

    return await per_call(lambda i: connection.fetchrow(READ, pick(i)), n), await per_call(end, n)


async def layers(engine: AsyncEngine, url: str, ids: list[str], n: int) -> dict[str, tuple[float, float]]:
    """Per layer: (CPU per read, CPU per ending update), in seconds."""
    sessions = make_session_factory(engine)
    table = DbMessage.__table__
    core_read = core_select(table).where(table.c.id == bindparam("id"))
    core_end = (
        update(table).where(table.c.id == bindparam("key")).values(content=bindparam("text")).returning(table)
    )

    def pick(i: int) -> str:
        return ids[i % len(ids)]

    async def orm_read(i: int) -> object:
        async with sessions() as session:
            return await session.get(DbMessage, pick(i))

    async def orm_end(i: int) -> object:
        async with sessions() as session:
            ended = update(DbMessage).where(DbMessage.id == pick(i)).values(content="y").returning(DbMessage)
            stored = select(DbMessage).from_statement(ended).execution_options(populate_existing=True)
            row = (await session.exec(stored)).scalars().one()
            await session.commit()
            return row

    async def core_read_step(i: int) -> object:
        async with engine.connect() as connection:
            return (await connection.execute(core_read, {"id": pick(i)})).first()

    async def core_end_step(i: int) -> object:
        async with engine.begin() as connection:
            return (await connection.execute(core_end, {"key": pick(i), "text": "y"})).first()

    results: dict[str, tuple[float, float]] = {
        "ORM session (as the server)": (await per_call(orm_read, n), await per_call(orm_end, n)),
        "SQLAlchemy Core, pooled connection": (
            await per_call(core_read_step, n),
            await per_call(core_end_step, n),
        ),
    }
    async with engine.connect() as connection:
        pooled = (await connection.get_raw_connection()).driver_connection
        assert pooled is not None
        results["asyncpg under SQLAlchemy's pool"] = await driver_calls(pooled, pick, n)
    plain = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        results["asyncpg, plain"] = await driver_calls(plain, pick, n)
    finally:
        await plain.close()
    return results


async def run(args: argparse.Namespace) -> Report:
    n = args.transactions or (50 if args.tiny else 2000)
    report = Report(
        "sql_layer",
        "SQL layer: the server's CPU per database transaction, ORM to asyncpg",
        args.tiny,
        params={"transactions": n, "rows": MESSAGES},
    )
    with fresh_database("oasst_bench_sql") as url:
        engine = create_async_engine(url, pool_size=4)
        try:
            async with engine.begin() as connection:
                await connection.run_sync(SQLModel.metadata.create_all)
            sessions = make_session_factory(engine)
            async with sessions() as session:
                rows = [
                    DbMessage(kind="completion", role="assistant", state="in_progress", content="x")
                    for _ in range(MESSAGES)
                ]
                session.add_all(rows)
                await session.commit()
                ids = [row.id for row in rows]
            measured = await layers(engine, url, ids, n)
        finally:
            await engine.dispose()
    plain_read, plain_end = measured["asyncpg, plain"]
    table = Table(
        f"{n:,} transactions of each kind, one after another: the process's CPU per transaction (µs)",
        ["layer", "read by id", "vs plain", "end + return row, committed", "vs plain"],
    )
    for layer, (read, end) in measured.items():
        table.rows.append(
            [layer, num(read * 1e6), fmt_ratio(read / plain_read), num(end * 1e6), fmt_ratio(end / plain_end)]
        )
        report.metrics[layer] = {"read_us": read * 1e6, "end_us": end * 1e6}
    report.tables.append(table)
    return report


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--transactions", type=int, help="transactions of each kind a layer (full: 2,000)")
    main_wrapper(run, p.parse_args())


if __name__ == "__main__":
    main()
