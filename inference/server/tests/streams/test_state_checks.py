"""Batched state reads of silent streams (``streams.state_checks``), on the real database: the questions
of one moment share one statement, each asker gets its own message's state (None for none), an asker
that leaves does not disturb the others, and a failed read fails every asker as its own read would."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

from oasst_inference_server.db.engine import make_session_factory
from oasst_inference_server.streams.state_checks import StateChecks
from oasst_shared.schemas import MessageState
from tests.support.api import API, finish_message, start_chat
from tests.support.sql_statements import recorded_statements

pytestmark = API


async def test_one_statement_answers_every_question_of_a_moment(app, client, user, live_model) -> None:
    pending = await start_chat(client, user, "wait", live_model)
    done = await start_chat(client, user, "done", live_model)
    assert pending.assistant_id and done.assistant_id
    await finish_message(app, done.assistant_id)
    checks = StateChecks(app.state.session_factory)
    asked = [
        pending.assistant_id,
        done.assistant_id,
        pending.assistant_id,
        done.prompter_id,
        "no-such-message",
    ]
    with recorded_statements(app) as statements:
        states = await asyncio.gather(*(checks.state(message_id) for message_id in asked))
    assert states == [
        MessageState.pending,
        MessageState.complete,
        MessageState.pending,
        MessageState.manual,
        None,
    ]
    assert len([text for text in statements if text.upper().startswith("SELECT")]) == 1, statements


async def test_an_asker_that_leaves_does_not_disturb_the_others(app, client, user, live_model) -> None:
    chat = await start_chat(client, user, "wait", live_model)
    assert chat.assistant_id
    checks = StateChecks(app.state.session_factory, window=0.1)
    leaving = asyncio.create_task(checks.state(chat.assistant_id))
    staying = asyncio.create_task(checks.state(chat.assistant_id))
    await asyncio.sleep(0.02)
    leaving.cancel()
    assert await staying == MessageState.pending
    assert leaving.cancelled()


async def test_a_failed_read_fails_every_asker() -> None:
    nowhere = create_async_engine("postgresql+asyncpg://postgres@127.0.0.1:1/nowhere")
    try:
        checks = StateChecks(make_session_factory(nowhere))
        results = await asyncio.gather(checks.state("a"), checks.state("b"), return_exceptions=True)
        assert all(isinstance(result, OSError) for result in results), results
        # The next moment asks again (nothing is stuck on the failed batch).
        with pytest.raises(OSError):
            await checks.state("a")
    finally:
        await nowhere.dispose()


async def test_closing_cancels_the_open_questions(app) -> None:
    checks = StateChecks(app.state.session_factory, window=10.0)
    question = asyncio.create_task(checks.state("a"))
    await asyncio.sleep(0.01)
    await checks.close()
    with pytest.raises(asyncio.CancelledError):
        await question


async def test_the_apps_state_checks_take_no_connection_of_the_request_pool(
    app, client, user, live_model
) -> None:
    """Held streams ask for their message's state on connections of their own: 10,000 of them must not
    take the connections of the requests that open new streams (the request pool sees none of their
    reads; the state checks' own engine sees it)."""
    chat = await start_chat(client, user, "wait", live_model)
    assert chat.assistant_id
    request_pool = app.state.engine.sync_engine
    own = app.state.state_check_engine.sync_engine
    assert own is not request_pool
    seen: dict[str, list[str]] = {"requests": [], "own": []}

    def recorder(where: str):  # type: ignore[no-untyped-def]
        def record(conn, cursor, statement, parameters, *args) -> None:  # type: ignore[no-untyped-def]
            if "message.state" in statement and chat.assistant_id in str(parameters):
                seen[where].append(statement)

        return record

    on_requests, on_own = recorder("requests"), recorder("own")
    event.listen(request_pool, "before_cursor_execute", on_requests)
    event.listen(own, "before_cursor_execute", on_own)
    try:
        assert await app.state.message_reads.state_checks.state(chat.assistant_id) == MessageState.pending
    finally:
        event.remove(request_pool, "before_cursor_execute", on_requests)
        event.remove(own, "before_cursor_execute", on_own)
    assert seen["requests"] == []
    assert len(seen["own"]) == 1


async def test_questions_asked_while_a_read_is_slow_share_the_next_read(
    app, client, user, live_model
) -> None:
    """One read at a time: while a slow database holds the current read, the questions of the following
    moments wait together for one next read, instead of each moment's batch queueing for a connection
    of its own (a small pool of them timed out under 10,000 held streams)."""
    chats = [await start_chat(client, user, f"slow {n}", live_model) for n in range(3)]
    ids = [chat.assistant_id for chat in chats]
    assert all(ids)
    first_read = asyncio.Event()
    release = asyncio.Event()
    real = app.state.session_factory

    @contextlib.asynccontextmanager
    async def slow_sessions():  # type: ignore[no-untyped-def]
        if not first_read.is_set():
            first_read.set()
            await release.wait()
        async with real() as session:
            yield session

    checks = StateChecks(slow_sessions, window=0.01)  # type: ignore[arg-type]
    with recorded_statements(app) as statements:
        first = asyncio.create_task(checks.state(ids[0]))
        await first_read.wait()
        later = []
        for message_id in ids[1:]:  # two moments, each well past the window
            later.append(asyncio.create_task(checks.state(message_id)))
            await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(first, *later) == [MessageState.pending] * 3
    assert len([text for text in statements if text.upper().startswith("SELECT")]) == 2, statements
