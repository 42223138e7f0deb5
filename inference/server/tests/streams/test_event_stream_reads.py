"""What an event stream costs the database: the message is read once per request (the route's own
read is handed to the event reader), and a finished answer whose stream holds its terminal event is
served from the broker alone; readers of silent streams share their state reads, and one that sees its
message end takes the terminal event from the stream, reading the message only when the stream has none."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from sqlalchemy import update

from oasst_inference_server import events
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.streams.event_reader import read_message_events
from tests.support.api import API, finish_message, start_chat
from tests.support.sql_statements import recorded_statements

pytestmark = API


def message_reads(statements: list[str]) -> list[str]:
    """The SELECTs that read the message table (alone or joined to its chat)."""
    return [
        text
        for text in statements
        if text.upper().startswith("SELECT") and ("FROM message" in text or "JOIN message" in text)
    ]


STATE_CHECK = "SELECT message.id, message.state FROM message WHERE message.id IN"


def ids_in(text: str) -> int:
    """How many message ids a state check asked about: the bound parameters of its IN list."""
    in_list = text[len(STATE_CHECK) :].split(")", 1)[0]
    return in_list.count(",") + 1


async def test_the_events_of_a_finished_answer_read_the_message_once(client, user, live_model, app) -> None:
    conversation = await start_chat(client, user, model=live_model)
    message_id = conversation.assistant_id
    assert message_id is not None
    await finish_message(app, message_id, "Done.")
    message = await app.state.lifecycle.get(message_id)
    stream = events.stream_name(message_id)
    await app.state.broker.append_event(stream, events.token_event("Done."))
    await app.state.broker.append_event(stream, app.state.message_reads.final_event(message), terminal=True)
    url = f"/chats/{conversation.chat_id}/messages/{message_id}/events"
    with recorded_statements(app) as statements:
        response = await client.get(url, headers=user.headers)
    reads = message_reads(statements)
    assert response.status_code == 200
    assert response.text.count("data: ") == 2 and '"event_type":"message"' in response.text
    assert len(reads) == 1, reads  # the route's lookup; the reader reads no message of its own


async def test_silent_streams_ask_their_state_in_one_read_per_moment(client, user, live_model, app) -> None:
    """Readers of held streams (in progress, no event) ask the database for their message's state after
    each silent interval: all of a moment's readers share one SELECT, where each used to read its own."""
    lifecycle = app.state.lifecycle
    held = []
    for n in range(6):
        conversation = await start_chat(client, user, f"hold {n}", live_model)
        assert conversation.assistant_id is not None
        assert await lifecycle.claim(conversation.assistant_id, "ws-held") is not None
        held.append(await lifecycle.get(conversation.assistant_id))
    settings = app.state.settings.model_copy(update={"pending_update_interval": 0.3})

    async def connected() -> bool:
        return False

    async def read_one_batch(message) -> None:  # type: ignore[no-untyped-def]
        reader = read_message_events(
            app.state.message_reads, app.state.stream_fanout, settings, message, None, connected
        )
        try:
            await asyncio.wait_for(reader.__anext__(), 1.0)  # a held stream yields nothing
        except asyncio.TimeoutError:
            pass
        finally:
            await reader.aclose()

    try:
        with recorded_statements(app) as statements:
            await asyncio.gather(*(read_one_batch(message) for message in held))
        # Only the state checks: the app's own background work (dispatch, queue status) reads messages too.
        reads = [text for text in message_reads(statements) if text.startswith(STATE_CHECK)]
        # Two silent intervals of six readers (0.3 s, then 0.6 s: held streams back off): 12 reads one
        # by one. Shared, one per interval when the readers' timers line up; a loaded machine spreads them
        # past the batching window now and then, so the bound is loose, and some read must have answered
        # several readers.
        assert 1 <= len(reads) <= 9, reads
        assert max(ids_in(text) for text in reads) >= 2, reads
    finally:
        for message in held:
            await lifecycle.release(message.id, "ws-held", "test over", retryable=False)


async def test_a_held_stream_whose_message_finished_without_its_event_ends_from_the_database(
    client, user, live_model, app
) -> None:
    """The shared read still finds a message that finished while its stream said nothing (the terminal
    event lost): the reader ends with the terminal event rebuilt from the database."""
    lifecycle = app.state.lifecycle
    conversation = await start_chat(client, user, "hold", live_model)
    assert conversation.assistant_id is not None
    assert await lifecycle.claim(conversation.assistant_id, "ws-held") is not None
    message = await lifecycle.get(conversation.assistant_id)
    settings = app.state.settings.model_copy(update={"pending_update_interval": 0.2})

    async def connected() -> bool:
        return False

    async def finish_quietly() -> None:
        await asyncio.sleep(0.3)
        await finish_message(app, conversation.assistant_id, "Finished quietly.")

    finisher = asyncio.create_task(finish_quietly())
    batches = [
        batch
        async for batch in read_message_events(
            app.state.message_reads, app.state.stream_fanout, settings, message, None, connected
        )
    ]
    await finisher
    events_read = [event for batch in batches for event in batch]
    assert len(events_read) == 1 and '"event_type":"message"' in events_read[0]["data"]
    assert "Finished quietly." in events_read[0]["data"]
    assert "id" not in events_read[0]  # rebuilt from the database: no stream entry of its own


async def test_a_reader_that_sees_its_message_end_before_the_event_takes_the_event_from_the_stream(
    client, user, live_model, app
) -> None:
    """The lifecycle updates the database just before it appends the terminal event. A silent reader whose
    state check sees the end in that moment waits for the event on the stream (it ends with it, its id
    included) and reads no message: at a burst of answers ending at once, thousands of readers each
    reading their whole message emptied the request pool and cut their streams."""
    lifecycle = app.state.lifecycle
    conversation = await start_chat(client, user, "hold", live_model)
    message_id = conversation.assistant_id
    assert message_id is not None
    assert await lifecycle.claim(message_id, "ws-held") is not None
    message = await lifecycle.get(message_id)  # in progress, as the reader's route read it
    await finish_message(app, message_id, "Ended on the stream.")
    ended = await lifecycle.get(message_id)
    assert ended is not None
    final = app.state.message_reads.final_event(ended)
    settings = app.state.settings.model_copy(update={"pending_update_interval": 0.2})

    async def connected() -> bool:
        return False

    async def append_after_the_state_check(statements: list[str]) -> str:
        while not any(text.startswith(STATE_CHECK) for text in statements):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the reader has had the state check's answer for a while
        return await app.state.broker.append_event(events.stream_name(message_id), final, terminal=True)

    with recorded_statements(app, about=message_id) as statements:
        appender = asyncio.create_task(append_after_the_state_check(statements))
        batches = [
            batch
            async for batch in read_message_events(
                app.state.message_reads, app.state.stream_fanout, settings, message, None, connected
            )
        ]
        event_id = await appender
    assert [event for batch in batches for event in batch] == [{"id": event_id, "data": final}]
    assert any(text.startswith(STATE_CHECK) for text in statements), statements
    assert [text for text in message_reads(statements) if not text.startswith(STATE_CHECK)] == []


async def test_a_reader_of_a_long_finished_message_whose_stream_expired_ends_at_once(
    client, user, live_model, app
) -> None:
    """Without a stream, the database's terminal event; and no wait for a stream event when the message the
    reader was given had ended long before (the state check gives the state alone, not its age)."""
    conversation = await start_chat(client, user, "long ago", live_model)
    message_id = conversation.assistant_id
    assert message_id is not None
    await finish_message(app, message_id, "Ended long ago.")
    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage)
            .where(DbMessage.id == message_id)  # type: ignore[arg-type]
            .values(finished_at=utcnow() - timedelta(minutes=5))
        )
        await session.commit()
    message = await app.state.lifecycle.get(message_id)
    settings = app.state.settings.model_copy(update={"pending_update_interval": 0.2})

    async def connected() -> bool:
        return False

    started = time.monotonic()
    batches = [
        batch
        async for batch in read_message_events(
            app.state.message_reads, app.state.stream_fanout, settings, message, None, connected
        )
    ]
    took = time.monotonic() - started
    events_read = [event for batch in batches for event in batch]
    assert len(events_read) == 1 and "Ended long ago." in events_read[0]["data"]
    assert "id" not in events_read[0]
    assert took < 1.5, took  # the stream's grace (2 s) is for messages that have just ended
