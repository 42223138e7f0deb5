"""JSON stored in the database and read back (sampling_parameters, request_payload, result_payload,
scheduling, a user's settings): a row that no longer reads under today's rules (stored by an older
version, or under a rule tightened since) or that nests too deeply is shown as far as it reads, and a
message whose stored request cannot be read fails alone at its claim; never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from oasst_inference_server.db.models import DbMessage, DbUserSettings
from oasst_inference_server.dispatch.work_frames import UnsendableMessage
from oasst_inference_server.scheduling import fair_share
from oasst_shared.limits import MAX_JSON_DEPTH
from tests.support.api import API, finish_message, start_chat

pytestmark = API


def deep(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


async def store(app, message_id: str, **values: Any) -> None:
    async with app.state.session_factory() as session:
        await session.exec(update(DbMessage).where(DbMessage.id == message_id).values(**values))
        await session.commit()


UNREADABLE_SAMPLING = [
    {"temperature": "hot"},
    {"max_new_tokens": -5},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "bad name\n", "schema": {}}}},
    {"response_format": {"type": "json_schema", "json_schema": {"schema": deep(MAX_JSON_DEPTH + 10)}}},
    [1, 2, 3],
    "a string",
]
UNREADABLE_RESULTS = [{"tool_calls": "x"}, {"tool_calls": [{"id": 5}]}, {"tool_calls": [deep(200)]}, ["x"]]


@pytest.mark.parametrize("sampling", UNREADABLE_SAMPLING, ids=range(len(UNREADABLE_SAMPLING)))
async def test_a_message_whose_stored_json_no_longer_reads_is_still_shown(
    client, app, user, live_model, sampling
):
    chat = await start_chat(client, user, "hi", live_model)
    await finish_message(app, chat.assistant_id, "an answer")
    for result in UNREADABLE_RESULTS:
        await store(app, chat.assistant_id, sampling_parameters=sampling, result_payload=result)
        whole = await client.get(f"/chats/{chat.chat_id}", headers=user.headers)
        assert whole.status_code == 200, whole.text
        shown = next(m for m in whole.json()["messages"] if m["id"] == chat.assistant_id)
        assert shown["content"] == "an answer"
        assert shown["sampling_parameters"] is None and shown.get("tool_calls") is None
        one = await client.get(f"/chats/{chat.chat_id}/messages/{chat.assistant_id}", headers=user.headers)
        assert one.status_code == 200, one.text


async def test_the_event_stream_of_such_a_message_ends_with_it(client, app, user, live_model):
    chat = await start_chat(client, user, "hi", live_model)
    await finish_message(app, chat.assistant_id, "an answer")
    await store(app, chat.assistant_id, sampling_parameters=UNREADABLE_SAMPLING[3], result_payload=["x"])
    # No stream was written for it: the reader falls back to the stored message, and ends with it.
    events = await client.get(
        f"/chats/{chat.chat_id}/messages/{chat.assistant_id}/events", headers=user.headers
    )
    assert events.status_code == 200 and '"event_type":"message"' in events.text, events.text
    assert '"sampling_parameters":null' in events.text


async def test_settings_that_no_longer_read_fall_back_to_the_defaults(client, app, user):
    for stored in (
        {"theme": "purple"},
        {"custom_sampling_parameters": {"top_p": 7}},
        deep(300),
        {"a": [[[1]]]},
    ):
        async with app.state.session_factory() as session:
            row = await session.get(DbUserSettings, user.id)
            if row is None:
                session.add(DbUserSettings(user_id=user.id, settings=stored))
            else:
                row.settings = stored
                session.add(row)
            await session.commit()
        response = await client.get("/account/settings", headers=user.headers)
        assert response.status_code == 200, response.text
        assert response.json()["theme"] == "system"


@pytest.mark.parametrize(
    "kind, payload",
    [
        ("completion", ["not", "an", "object"]),
        ("completion", {"thread": 5}),
        ("completion", {"thread": "a string"}),
        ("completion", {"thread": [{"role": "user", "content": "hi"}], "tools": 7}),
        ("completion", {"thread": [{"role": "user", "content": "hi"}], "tool_choice": {"x": 1}}),
        ("embedding", {"inputs": 3}),
        ("embedding", "inputs"),
    ],
)
async def test_a_stored_request_that_no_longer_reads_fails_alone_at_its_claim(
    client, app, user, live_model, kind, payload
):
    chat = await start_chat(client, user, "fine", live_model)
    await store(app, chat.assistant_id, kind=kind, request_payload=payload)
    with pytest.raises(UnsendableMessage, match="cannot be sent to a worker"):
        await app.state.lifecycle.claim(chat.assistant_id, "ws-test", max_input_tokens=1536)
    message = await app.state.lifecycle.get(chat.assistant_id)
    assert message.state == "pending" and message.attempts == 0  # the caller fails it, as any unsendable one
    # Its fair-queue estimate does not stumble on it either.
    await store(app, chat.assistant_id, sampling_parameters={"max_new_tokens": "many"})
    async with app.state.session_factory() as session:
        message = await session.get(DbMessage, chat.assistant_id)
        ticket = await fair_share.new_ticket(session, app.state.settings, message)
    assert ticket.max_new_tokens == 0 and ticket.user == user.id
