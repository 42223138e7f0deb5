"""``db.batched``: the asks that come while a statement runs share the next one, within its bounds: at
most ``max_batch`` asks and ``max_bytes`` of them (a larger ask alone), never one key twice."""

from __future__ import annotations

import asyncio

from oasst_inference_server.db.batched import Batched


async def test_a_statement_carries_at_most_max_bytes_and_a_larger_ask_alone() -> None:
    statements: list[list[str]] = []

    async def run(asks: list[str]) -> list[int]:
        statements.append(asks)
        await asyncio.sleep(0)
        return [len(ask) for ask in asks]

    batched: Batched[str, int] = Batched(run, limit=1, size=len, max_bytes=10)
    asks = ["first", "aaaaaa", "bbbbbb", "c", "x" * 25, "dd"]
    answers = await asyncio.gather(*(batched.ask(ask) for ask in asks))
    assert answers == [len(ask) for ask in asks]  # each ask its own answer
    assert sorted(ask for statement in statements for ask in statement) == sorted(asks)
    for statement in statements:
        assert len(statement) == 1 or sum(map(len, statement)) <= 10, statements
    assert ["x" * 25] in statements  # larger than the bound: alone, not refused
    assert len(statements) < len(asks)  # and still shared where they fit
