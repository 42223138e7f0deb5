"""The per-user turns that serialize admission on SQLite: one holder per user, released on every path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.admission.user_turns import UserTurns


async def test_one_holder_per_user_and_others_never_wait() -> None:
    turns = UserTurns(enabled=True)
    order: list[str] = []
    inside = asyncio.Event()
    leave = asyncio.Event()

    async def hold(user: str, name: str) -> None:
        async with turns.turn(user):
            order.append(f"{name} in")
            inside.set()
            await leave.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(hold("u", "first"))
    await inside.wait()
    second = asyncio.create_task(hold("u", "second"))
    async with turns.turn("someone else"):  # another user's turn is free
        order.append("other")
    await asyncio.sleep(0.01)
    assert order == ["first in", "other"]  # the second waits for the first
    leave.set()
    await asyncio.gather(first, second)
    assert order == ["first in", "other", "first out", "second in", "second out"]
    assert turns.held() == 0


async def test_a_turn_is_given_back_on_errors_and_cancellation() -> None:
    turns = UserTurns(enabled=True)
    with pytest.raises(RuntimeError):
        async with turns.turn("u"):
            raise RuntimeError("the submission failed")
    holding = asyncio.Event()

    async def hold_forever() -> None:
        async with turns.turn("u"):
            holding.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(hold_forever())
    await holding.wait()
    waiter = asyncio.create_task(hold_forever())
    await asyncio.sleep(0.01)
    waiter.cancel()  # cancelled while it waits for the turn
    holder.cancel()  # cancelled while it holds it
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert turns.held() == 0
    async with asyncio.timeout(1):
        async with turns.turn("u"):  # free again
            pass


async def test_disabled_turns_never_wait() -> None:
    turns = UserTurns(enabled=False)
    async with turns.turn("u"), turns.turn("u"):  # Postgres: the row lock serializes instead
        assert turns.held() == 0


async def test_a_waiting_request_gives_its_connection_back(tmp_path: Path) -> None:
    """A request waiting for the turn holds no pooled connection: with a pool of one, the holder still
    gets one for its own queries (a burst of one user once held the whole pool: 503 after its timeout)."""
    engine = create_async_engine(
        f"sqlite+aiosqlite:///{tmp_path}/turns.db",
        poolclass=AsyncAdaptedQueuePool,
        pool_size=1,
        max_overflow=0,
        pool_timeout=2,
    )
    sessions = async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)
    turns = UserTurns(enabled=True)
    holding = asyncio.Event()
    waiting = asyncio.Event()

    async def waiter() -> None:
        async with sessions() as session:
            await session.exec(text("select 1"))  # type: ignore[call-overload]  # holds the one connection
            waiting.set()
            async with turns.turn("u", session):
                await session.exec(text("select 2"))  # type: ignore[call-overload]

    try:
        async with sessions() as session:
            async with turns.turn("u", session):
                holding.set()
                task = asyncio.create_task(waiter())
                await waiting.wait()
                await asyncio.sleep(0.05)  # the waiter is now waiting for the turn
                assert (await session.exec(text("select 3"))).one() == (3,)  # type: ignore[call-overload]
                await session.commit()
        await asyncio.wait_for(task, 5)
    finally:
        await engine.dispose()
    assert turns.held() == 0
