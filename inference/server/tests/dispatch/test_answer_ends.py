"""Answers' ends batched on Postgres (``dispatch.answer_ends``): ends asked while a statement runs share the
next one, each gets its own message as stored (or None where it did not end it), a message is never twice
in a statement, an end asked alone runs at once, and a failed statement raises in each end it carried."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from oasst_inference_server.dispatch.answer_ends import AnswerEnds
from oasst_inference_server.dispatch.message_lifecycle import _result_values
from oasst_shared.protocol import GeneratedText
from tests.support.api import API, start_chat
from tests.support.sql_statements import recorded_statements

pytestmark = API


def values(message_id: str, text: str, tool_calls: bool = False) -> dict[str, object]:
    result = GeneratedText(message_id=message_id, text=text, finish_reason="length", generated_tokens=2)
    stored = _result_values(result)
    if tool_calls:
        stored["result_payload"] = {"tool_calls": [{"id": "call_1"}]}
    return stored


async def claimed(app, client, user, model: str, session_id: str, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    for i in range(count):
        chat = await start_chat(client, user, f"question {i}", model)
        assert await app.state.lifecycle.claim(chat.assistant_id, session_id) is not None
        ids.append(chat.assistant_id)
    return ids


def ends_of(app) -> AnswerEnds:  # type: ignore[no-untyped-def]
    ends = app.state.lifecycle.answer_ends
    assert isinstance(ends, AnswerEnds)  # the app runs on Postgres
    return ends


async def test_ends_asked_together_share_statements_and_each_gets_its_message(
    app, client, user, live_model
) -> None:
    ids = await claimed(app, client, user, live_model, "ws-batch", 12)
    ends = ends_of(app)
    with recorded_statements(app) as statements:
        stored = await asyncio.gather(
            *(
                ends.end(
                    message_id, "ws-batch", cancelled=False, values=values(message_id, f"answer {i}", i == 0)
                )
                for i, message_id in enumerate(ids)
            ),
            # Another session's end of one of them ends nothing.
            ends.end(ids[1], "ws-stale", cancelled=False, values=values(ids[1], "not mine")),
        )
    # Fewer statements than ends: those asked while one ran waited for the next.
    updates = [s for s in statements if "UPDATE message" in s]
    assert 1 <= len(updates) < len(ids), updates
    for i, (message_id, message) in enumerate(zip(ids, stored[:-1], strict=True)):
        assert message is not None and message.id == message_id
        assert (message.state, message.content) == ("complete", f"answer {i}")
        read = await app.state.lifecycle.get(message_id)
        assert (read.state, read.content, read.finish_reason, read.generated_tokens) == (
            "complete",
            f"answer {i}",
            "length",
            2,
        )
        # A result payload where the end has one; none (left as it was) where it has none.
        assert read.result_payload == ({"tool_calls": [{"id": "call_1"}]} if i == 0 else None)
    assert stored[-1] is None


async def test_a_message_is_never_twice_in_one_statement(app, client, user, live_model) -> None:
    first_id, message_id = await claimed(app, client, user, live_model, "ws-twice", 2)
    # One statement at a time: the first end runs alone, the two ends of one message wait together.
    ends = AnswerEnds(app.state.lifecycle.answer_ends._driver, connections=1)
    _, first, second = await asyncio.gather(
        ends.end(first_id, "ws-twice", cancelled=False, values=values(first_id, "before")),
        ends.end(message_id, "ws-twice", cancelled=False, values=values(message_id, "first")),
        ends.end(message_id, "ws-twice", cancelled=False, values=values(message_id, "second")),
    )
    # One of the two ended it; the other found it ended (and so neither charges nor ends it twice).
    assert [m is None for m in (first, second)].count(True) == 1
    read = await app.state.lifecycle.get(message_id)
    assert read.content == (first or second).content
    assert ends.statements == 3


async def test_a_cancelled_end_and_a_cancel_asked_meanwhile_both_store_cancelled(
    app, client, user, live_model
) -> None:
    told, asked = await claimed(app, client, user, live_model, "ws-cancel", 2)
    lifecycle = app.state.lifecycle
    await lifecycle.request_cancel(await lifecycle.get(asked))
    ends = ends_of(app)
    stored = await asyncio.gather(
        ends.end(told, "ws-cancel", cancelled=True, values=values(told, "cut")),
        ends.end(asked, "ws-cancel", cancelled=False, values=values(asked, "all of it")),
    )
    assert [(m.state, m.content) for m in stored] == [("cancelled", "cut"), ("cancelled", "all of it")]


async def test_a_failed_statement_raises_in_every_end_it_carried(
    app, client, user, live_model, monkeypatch
) -> None:
    ids = await claimed(app, client, user, live_model, "ws-fail", 3)
    ends = ends_of(app)
    monkeypatch.setattr(
        "oasst_inference_server.dispatch.answer_ends.END_ANSWERS", "SELECT * FROM no_such_table"
    )
    outcomes = await asyncio.gather(
        *(ends.end(m, "ws-fail", cancelled=False, values=values(m, "x")) for m in ids),
        return_exceptions=True,
    )
    assert all(isinstance(outcome, asyncpg.UndefinedTableError) for outcome in outcomes), outcomes
    monkeypatch.undo()
    # Nothing was stored, and asked again they end.
    for message_id in ids:
        assert (await app.state.lifecycle.get(message_id)).state == "in_progress"
        assert await ends.end(message_id, "ws-fail", cancelled=False, values=values(message_id, "x"))


async def test_an_end_that_stops_waiting_does_not_stop_the_statement(app, client, user, live_model) -> None:
    (message_id,) = await claimed(app, client, user, live_model, "ws-leave", 1)
    ends = ends_of(app)
    asker = asyncio.create_task(
        ends.end(message_id, "ws-leave", cancelled=False, values=values(message_id, "kept"))
    )
    await asyncio.sleep(0)  # its statement has started
    asker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asker
    for _ in range(100):
        if (await app.state.lifecycle.get(message_id)).state == "complete":
            break
        await asyncio.sleep(0.02)
    assert (await app.state.lifecycle.get(message_id)).content == "kept"


async def test_ends_lock_their_rows_in_the_order_of_their_ids(app, client, user, live_model) -> None:
    """Another statement that locks several messages in id order (as the lease extensions do) never
    deadlocks with a statement of ends, whatever order the ends came in and the rows lie in."""
    # Two messages made in the order opposite to their ids' (the higher one made first), named in that
    # order: a statement that locked by the table's order or by its arrays' would take the higher first.
    made = await claimed(app, client, user, live_model, "ws-order", 2)
    while made[-2] < made[-1]:
        made += await claimed(app, client, user, live_model, "ws-order", 1)
    high, low = made[-2], made[-1]
    (first,) = await claimed(app, client, user, live_model, "ws-order", 1)
    url = app.state.settings.database_url.replace("postgresql+asyncpg://", "postgresql://")
    other = await asyncpg.connect(url)
    try:
        transaction = other.transaction()
        await transaction.start()
        await other.execute("SELECT id FROM message WHERE id = $1 FOR UPDATE", low)
        # One statement at a time: after a first end alone, the two share one, which waits for the lower.
        ends = AnswerEnds(ends_of(app)._driver, connections=1)
        batch = asyncio.gather(
            *(ends.end(m, "ws-order", cancelled=False, values=values(m, "done")) for m in (first, high, low))
        )
        await asyncio.sleep(0.3)
        # The other goes on to the higher: in id order the statement holds neither yet.
        await asyncio.wait_for(other.execute("SELECT id FROM message WHERE id = $1 FOR UPDATE", high), 5)
        await transaction.commit()
        stored = await asyncio.wait_for(batch, 10)
    finally:
        await other.close()
    assert [m.state for m in stored] == ["complete"] * 3
    assert ends.statements == 2
