"""What an event stream costs the database: the message is read once per request (the route's own
read is handed to the event reader), and a finished answer whose stream holds its terminal event is
served from the broker alone."""

from __future__ import annotations

from oasst_inference_server.dispatch import events
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


async def test_the_events_of_a_finished_answer_read_the_message_once(client, user, live_model, app) -> None:
    conversation = await start_chat(client, user, model=live_model)
    message_id = conversation.assistant_id
    assert message_id is not None
    await finish_message(app, message_id, "Done.")
    message = await app.state.lifecycle.get(message_id)
    stream = events.stream_name(message_id)
    await app.state.broker.append_event(stream, events.token_event("Done."))
    await app.state.broker.append_event(stream, app.state.lifecycle.final_event(message), terminal=True)
    url = f"/chats/{conversation.chat_id}/messages/{message_id}/events"
    with recorded_statements(app) as statements:
        response = await client.get(url, headers=user.headers)
    reads = message_reads(statements)
    assert response.status_code == 200
    assert response.text.count("data: ") == 2 and '"event_type":"message"' in response.text
    assert len(reads) == 1, reads  # the route's lookup; the reader reads no message of its own
