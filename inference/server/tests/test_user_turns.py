"""The per-user turns that serialize admission on SQLite: one holder per user, released on every path."""

from __future__ import annotations

import asyncio

import pytest

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
