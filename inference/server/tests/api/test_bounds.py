"""Bounds at the API: system prompts, stop strings, sampling ranges, messages per request,
chats per user and event-stream readers, each refused with a 4xx naming the limit."""

from __future__ import annotations

import uuid

from oasst_inference_server.streams.reader_slots import READER_SLOT_TTL, acquire_reader
from oasst_shared.limits import MAX_STOP_SEQUENCE_LENGTH, MAX_TOP_K
from tests.support.api import API, MAX_CHATS_PER_USER, assert_error, finish_message, start_chat

pytestmark = API


async def test_system_prompt_stop_strings_and_sampling_ranges(client, user, live_model, settings):
    conversation = await start_chat(client, user)
    url = f"/chats/{conversation.chat_id}/assistant_message"

    async def ask(**fields):
        body = {"parent_id": conversation.prompter_id, "model_config_name": live_model, **fields}
        return await client.post(url, json=body, headers=user.headers)

    long_prompt = "s" * (settings.max_system_prompt_length + 1)
    assert_error(await ask(system_prompt=long_prompt), 422, "system_prompt_too_long")
    for sampling in (
        {"stop": ["x" * (MAX_STOP_SEQUENCE_LENGTH + 1)]},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"top_k": MAX_TOP_K + 1},
        {"top_p": 1.5},
        {"temperature": -1},
        {"max_new_tokens": 10**9},
        {"repetition_penalty": 0},
    ):
        assert_error(await ask(sampling_parameters=sampling), 422, "validation_error")
    assert (await ask(sampling_parameters={"stop": ["x" * MAX_STOP_SEQUENCE_LENGTH]})).status_code == 200


async def test_v1_bounds_messages_and_stop_strings(client, user, settings):
    def completion(**fields):
        return {"model": "any", "messages": [{"role": "user", "content": "hi"}], **fields}

    too_many = [{"role": "user", "content": "hi"}] * (settings.max_messages_per_request + 1)
    for body, code in (
        (completion(messages=too_many), "too_many_messages"),
        (
            completion(
                messages=[
                    {"role": "system", "content": "s" * (settings.max_system_prompt_length + 1)},
                    {"role": "user", "content": "hi"},
                ]
            ),
            "system_prompt_too_long",
        ),
        (
            completion(messages=[{"role": "user", "content": "u" * (settings.max_message_length + 1)}]),
            "message_too_long",
        ),
    ):
        response = await client.post("/v1/chat/completions", json=body, headers=user.headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == code, response.text
    response = await client.post(
        "/v1/chat/completions",
        json=completion(stop=["x" * (MAX_STOP_SEQUENCE_LENGTH + 1)]),
        headers=user.headers,
    )
    assert response.status_code in (400, 404), response.text  # refused (or no such model): never a 5xx


async def test_chats_per_user(client, login, other_user):
    user = await login()
    ids = []
    for _ in range(MAX_CHATS_PER_USER):
        created = await client.post("/chats", json={}, headers=user.headers)
        assert created.status_code == 200, created.text
        ids.append(created.json()["id"])
    assert_error(await client.post("/chats", json={}, headers=user.headers), 409, "too_many_chats")
    assert (await client.post("/chats", json={}, headers=other_user.headers)).status_code == 200
    assert (await client.delete(f"/chats/{ids[0]}", headers=user.headers)).status_code == 204
    assert (await client.post("/chats", json={}, headers=user.headers)).status_code == 200


async def test_event_stream_readers_per_message_and_per_user(
    app, client, login, other_user, live_model, settings
):
    user = await login()
    conversation = await start_chat(client, user, model=live_model)
    events = f"/chats/{conversation.chat_id}/messages/{conversation.assistant_id}/events"
    broker = app.state.broker
    # Readers on another replica hold every slot of the message (taken straight from the broker).
    held = [
        await acquire_reader(broker, settings, f"someone-{i}", conversation.assistant_id)
        for i in range(settings.max_sse_readers_per_message)
    ]
    assert_error(await client.get(events, headers=user.headers), 429, "too_many_readers")
    # A slot given back is free again; the finished answer streams and gives its own slot back.
    await held.pop().release()
    await finish_message(app, conversation.assistant_id)
    for _ in range(3):
        streamed = await client.get(events, headers=user.headers)
        assert streamed.status_code == 200 and '"event_type":"message"' in streamed.text, streamed.text
    # The user's own cap: other messages do not help once the user holds max_sse_readers_per_user.
    mine = [
        await acquire_reader(broker, settings, user.id, str(uuid.uuid4()))
        for _ in range(settings.max_sse_readers_per_user)
    ]
    other = await start_chat(client, user, model=live_model)
    other_events = f"/chats/{other.chat_id}/messages/{other.assistant_id}/events"
    assert_error(await client.get(other_events, headers=user.headers), 429, "too_many_readers")
    # Nobody else notices.
    theirs = await start_chat(client, other_user, model=live_model)
    await finish_message(app, theirs.assistant_id)
    their_events = f"/chats/{theirs.chat_id}/messages/{theirs.assistant_id}/events"
    assert (await client.get(their_events, headers=other_user.headers)).status_code == 200
    for lease in held + mine:
        await lease.release()
    assert READER_SLOT_TTL > 0
