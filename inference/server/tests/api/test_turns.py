"""POST /chats/{id}/turns: the user's message and the answer in one call, streamed back; both messages
or neither; resumable from the answer's events route."""

from __future__ import annotations

import asyncio
import json
from contextlib import aclosing

from oasst_inference_server import events
from oasst_inference_server.streams import event_reader
from oasst_shared.protocol import GeneratedText
from tests.support.api import API, MAX_MESSAGES_PER_CHAT, assert_error, finish_message, start_chat
from tests.support.sql_statements import recorded_statements

pytestmark = API


def data_events(text: str) -> list[dict]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]


async def post_turn(client, user, chat_id: str, body: dict):
    # The in-process transport gives the response once the stream ended: bound the wait.
    return await asyncio.wait_for(client.post(f"/chats/{chat_id}/turns", json=body, headers=user.headers), 30)


async def new_chat(client, user) -> str:
    return (await client.post("/chats", json={}, headers=user.headers)).json()["id"]


async def chat_messages(client, user, chat_id: str) -> list[dict]:
    chat = await client.get(f"/chats/{chat_id}", headers=user.headers)
    assert chat.status_code == 200, chat.text
    return chat.json()["messages"]


async def answer_as_a_worker(app, chat_id: str, text: str) -> str:
    """Wait for the turn's pending answer, then claim it, stream two tokens and finish it."""
    lifecycle, broker = app.state.lifecycle, app.state.broker
    for _ in range(500):
        queued = await broker.queued_ids(events.work_queue_name(app.state.live_model))
        found = [await lifecycle.get(m) for m in queued]
        pending = [m.id for m in found if m and m.chat_id == chat_id and m.state == "pending"]
        if pending:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the turn's answer was never queued")
    message_id = pending[0]
    assert await lifecycle.claim(message_id, "ws-turns") is not None
    half = len(text) // 2
    await broker.append_events(
        [(events.stream_name(message_id), events.token_event(t)) for t in (text[:half], text[half:])]
    )
    done = GeneratedText(message_id=message_id, text=text, finish_reason="eos_token", generated_tokens=2)
    assert await lifecycle.complete("ws-turns", done)
    return message_id


async def answered_turn(client, app, user, live_model: str, content: str, text: str):
    """A turn in a new chat, answered with ``text`` by :func:`answer_as_a_worker`: its response."""
    app.state.live_model = live_model
    chat_id = await new_chat(client, user)
    worker = asyncio.create_task(answer_as_a_worker(app, chat_id, text))
    response = await post_turn(client, user, chat_id, {"content": content, "model_config_name": live_model})
    await worker
    assert response.status_code == 200, response.text
    return response


async def test_a_turn_creates_both_messages_and_streams_the_answer(client, app, user, live_model):
    app.state.live_model = live_model
    chat_id = await new_chat(client, user)
    worker = asyncio.create_task(answer_as_a_worker(app, chat_id, "Hello back."))
    response = await post_turn(
        client, user, chat_id, {"content": "Hello there", "model_config_name": live_model}
    )
    answered = await worker
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    stream = data_events(response.text)
    created = stream[0]
    assert created["event_type"] == "created"
    prompt, answer = created["prompter_message"], created["assistant_message"]
    assert prompt["role"] == "prompter" and prompt["content"] == "Hello there" and prompt["parent_id"] is None
    assert answer["id"] == answered and answer["parent_id"] == prompt["id"] and answer["state"] == "pending"
    assert "".join(e["text"] for e in stream if e["event_type"] == "token") == "Hello back."
    assert stream[-1]["event_type"] == "message" and stream[-1]["message"]["content"] == "Hello back."
    # The events carry ids: the answer can be read again (or resumed) from its events route.
    again = await client.get(f"/chats/{chat_id}/messages/{answered}/events", headers=user.headers, timeout=30)
    assert [e for e in data_events(again.text) if e["event_type"] != "pending"] == [
        e for e in stream[1:] if e["event_type"] != "pending"
    ]
    messages = await chat_messages(client, user, chat_id)
    assert [(m["id"], m["role"]) for m in messages] == [(prompt["id"], "prompter"), (answered, "assistant")]

    # The next turn replies to the answer.
    worker = asyncio.create_task(answer_as_a_worker(app, chat_id, "Twice."))
    second = await post_turn(
        client, user, chat_id, {"parent_id": answered, "content": "Again", "model_config_name": live_model}
    )
    await worker
    assert data_events(second.text)[0]["prompter_message"]["parent_id"] == answered
    assert len(await chat_messages(client, user, chat_id)) == 4


async def test_a_refused_turn_creates_nothing(client, app, user, live_model):
    chat_id = await new_chat(client, user)
    url = f"/chats/{chat_id}/turns"
    assert_error(
        await client.post(
            url, json={"content": "hi", "model_config_name": "no-such-model"}, headers=user.headers
        ),
        400,
        "unknown_model",
    )
    assert_error(
        await client.post(url, json={"content": "  ", "model_config_name": live_model}, headers=user.headers),
        422,
        "empty_message",
    )
    unknown_parent = {"parent_id": "nope", "content": "hi", "model_config_name": live_model}
    assert_error(await client.post(url, json=unknown_parent, headers=user.headers), 400, "parent_not_found")
    assert await chat_messages(client, user, chat_id) == []
    other = await client.post("/chats", json={}, headers=user.headers)
    assert (
        await client.post(
            f"/chats/{other.json()['id']}/turns",
            json={"content": "hi", "model_config_name": live_model},
            headers={"Authorization": "Bearer nonsense"},
        )
    ).status_code == 401


async def test_a_turn_that_would_overfill_the_chat_is_refused_whole(client, app, user, live_model):
    app.state.live_model = live_model
    chat_id = await new_chat(client, user)
    parent = None
    for i in range(MAX_MESSAGES_PER_CHAT // 2):
        worker = asyncio.create_task(answer_as_a_worker(app, chat_id, f"answer {i}"))
        body = {"parent_id": parent, "content": f"prompt {i}", "model_config_name": live_model}
        turn = await post_turn(client, user, chat_id, body)
        assert turn.status_code == 200, turn.text
        parent = await worker
    full = await client.post(
        f"/chats/{chat_id}/turns",
        json={"parent_id": parent, "content": "one more", "model_config_name": live_model},
        headers=user.headers,
    )
    assert_error(full, 409, "chat_full")
    assert len(await chat_messages(client, user, chat_id)) == MAX_MESSAGES_PER_CHAT
    await finish_message(app, parent)


async def test_an_answer_that_gets_a_worker_at_once_streams_without_a_queue_position(
    client, app, user, live_model, monkeypatch
):
    # The reader gives the worker this long before it works out a queue position: longer than the
    # worker below takes, however loaded the machine.
    monkeypatch.setattr(event_reader, "FIRST_PENDING_WAIT", 10.0)
    reads = app.state.message_reads
    asked: list[str] = []
    queue_position = reads.queue_position

    async def counted(message):
        asked.append(message.id)
        return await queue_position(message)

    monkeypatch.setattr(reads, "queue_position", counted)
    response = await answered_turn(client, app, user, live_model, "Quick", "At once.")
    stream = data_events(response.text)
    assert [e["event_type"] for e in stream] == ["created", "token", "token", "message"]
    assert asked == []


async def test_an_answer_that_waits_gets_its_queue_position_after_the_first_wait(
    app, user, client, live_model, monkeypatch
):
    monkeypatch.setattr(event_reader, "FIRST_PENDING_WAIT", 0.05)
    conversation = await start_chat(client, user, model=live_model)
    assert conversation.assistant_id is not None
    lifecycle, settings = app.state.lifecycle, app.state.settings
    assert settings.pending_update_interval >= 0.5
    message = await lifecycle.get(conversation.assistant_id)
    reader = event_reader.read_message_events(
        app.state.message_reads, app.state.stream_fanout, settings, message, None, _connected
    )
    started = asyncio.get_running_loop().time()
    async with aclosing(reader) as batches:
        first = await asyncio.wait_for(anext(batches), 10)
    waited = asyncio.get_running_loop().time() - started
    assert [json.loads(e["data"])["event_type"] for e in first] == ["pending"]
    assert 0.05 <= waited < settings.pending_update_interval
    await finish_message(app, message.id)


async def _connected() -> bool:
    return False


async def test_a_turn_counts_its_chat_once(client, app, user, live_model):
    """The chat's size is counted once: the prompt's parent check and the answer's room and ticket
    reuse it."""
    with recorded_statements(app) as statements:
        response = await answered_turn(client, app, user, live_model, "Count", "Once.")
    assert data_events(response.text)[-1]["event_type"] == "message"
    counts = [s for s in statements if "sum(length(message.content))" in s]
    probes = [s for s in statements if s.startswith("SELECT message.id FROM message WHERE message.chat_id")]
    assert len(counts) == 1 and probes == []


async def test_a_turn_takes_and_gives_back_its_reader_slots_in_one_call_each(
    client, app, user, live_model, monkeypatch
):
    broker = app.state.broker
    calls: list[str] = []
    acquire_slots, release_slots = broker.acquire_slots, broker.release_slots

    async def acquiring(slots, holder, ttl):
        calls.append(f"acquire {len(slots)}")
        return await acquire_slots(slots, holder, ttl)

    async def releasing(names, holder):
        calls.append(f"release {len(names)}")
        await release_slots(names, holder)

    monkeypatch.setattr(broker, "acquire_slots", acquiring)
    monkeypatch.setattr(broker, "release_slots", releasing)
    await answered_turn(client, app, user, live_model, "Read", "Slots.")
    assert calls == ["acquire 2", "release 2"]
