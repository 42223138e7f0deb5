"""Continuation on the real Postgres and Redis: a message whose worker is lost after it streamed text keeps
that text, the next worker gets it as the start of the answer, and the finished answer is both parts.
The cases that cannot continue start over with a ``retry`` event, as before."""

from __future__ import annotations

import json

from sqlalchemy import update

from oasst_inference_server import events
from oasst_inference_server.db.models import DbMessage
from oasst_shared.protocol import GeneratedText, Work
from tests.support.api import API, start_chat

pytestmark = API


async def stream_types(app, message_id: str) -> list[dict]:
    entries = await app.state.broker.read_events(events.stream_name(message_id), None, timeout=0, count=1000)
    return [json.loads(entry.data) for entry in entries]


async def stream_tokens(app, message_id: str, *texts: str) -> None:
    for text in texts:
        await app.state.broker.append_event(events.stream_name(message_id), events.token_event(text))


async def set_values(app, message_id: str, **values: object) -> None:
    async with app.state.session_factory() as session:
        await session.exec(update(DbMessage).where(DbMessage.id == message_id).values(**values))
        await session.commit()


async def test_a_lost_workers_text_is_continued_by_the_next_worker_twice(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    message_id = (await start_chat(client, user, model=live_model)).assistant_id

    first = await lifecycle.claim(message_id, "ws-first", continues_answers=True)
    assert first is not None and isinstance(first.work, Work) and first.work.answer_prefix is None
    assert not first.restarted
    await stream_tokens(app, message_id, "Once", " upon")
    await lifecycle.release(message_id, "ws-first", "worker lost: killed")

    message = await lifecycle.get(message_id)
    assert message.state == "pending" and message.answer_prefix == "Once upon"
    last = (await stream_types(app, message_id))[-1]
    assert last == {"event_type": "continuation", "attempt": 2, "reason": "worker lost: killed"}

    second = await lifecycle.claim(message_id, "ws-second", continues_answers=True)
    assert second is not None and second.work.answer_prefix == "Once upon" and not second.restarted
    assert '"answer_prefix":"Once upon"' in second.frame
    await stream_tokens(app, message_id, " a")
    await lifecycle.release(message_id, "ws-second", "worker lost: killed again")
    assert (await lifecycle.get(message_id)).answer_prefix == "Once upon a"  # both workers' text

    third = await lifecycle.claim(message_id, "ws-third", continues_answers=True)
    assert third is not None and third.work.answer_prefix == "Once upon a"
    result = GeneratedText(
        message_id=message_id, text=" time.", finish_reason="eos_token", generated_tokens=2, prefix_tokens=3
    )
    assert await lifecycle.complete("ws-third", result)

    done = await lifecycle.get(message_id)
    assert done.state == "complete" and done.content == "Once upon a time."
    assert done.generated_tokens == 5 and done.attempts == 3 and done.answer_prefix is None
    kinds = [event["event_type"] for event in await stream_types(app, message_id)]
    assert "retry" not in kinds and kinds.count("continuation") == 2 and kinds[-1] == "message"


async def test_text_before_a_retry_is_not_part_of_the_prefix(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    message_id = (await start_chat(client, user, model=live_model)).assistant_id
    await stream_tokens(app, message_id, "discarded")
    await app.state.broker.append_event(events.stream_name(message_id), events.retry_event(2, "lost"))
    assert await lifecycle.claim(message_id, "ws-one", continues_answers=True) is not None
    await stream_tokens(app, message_id, "kept")
    await lifecycle.release(message_id, "ws-one", "worker lost")
    assert (await lifecycle.get(message_id)).answer_prefix == "kept"
    await lifecycle.fail(message_id, "test over")


async def test_a_constrained_answer_starts_over(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    message_id = (await start_chat(client, user, model=live_model)).assistant_id
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    await set_values(
        app,
        message_id,
        sampling_parameters={
            "max_new_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        },
    )
    assert await lifecycle.claim(message_id, "ws-one", continues_answers=True) is not None
    await stream_tokens(app, message_id, '{"a": "')
    await lifecycle.release(message_id, "ws-one", "worker lost")

    message = await lifecycle.get(message_id)
    assert message.state == "pending" and message.answer_prefix is None
    assert (await stream_types(app, message_id))[-1]["event_type"] == "retry"
    await lifecycle.fail(message_id, "test over")


async def test_nothing_streamed_starts_over(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    message_id = (await start_chat(client, user, model=live_model)).assistant_id
    assert await lifecycle.claim(message_id, "ws-one", continues_answers=True) is not None
    await lifecycle.release(message_id, "ws-one", "worker lost")
    assert (await lifecycle.get(message_id)).answer_prefix is None
    assert (await stream_types(app, message_id))[-1]["event_type"] == "retry"
    await lifecycle.fail(message_id, "test over")


async def test_a_worker_that_cannot_continue_starts_the_answer_over(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    message_id = (await start_chat(client, user, model=live_model)).assistant_id
    assert await lifecycle.claim(message_id, "ws-one", continues_answers=True) is not None
    await stream_tokens(app, message_id, "Half an answer")
    await lifecycle.release(message_id, "ws-one", "worker lost")
    assert (await lifecycle.get(message_id)).answer_prefix == "Half an answer"

    claimed = await lifecycle.claim(message_id, "ws-old", continues_answers=False)
    assert claimed is not None and claimed.restarted and claimed.work.answer_prefix is None
    assert (
        "answer_prefix" not in json.loads(claimed.frame) or json.loads(claimed.frame)["answer_prefix"] is None
    )
    assert (await lifecycle.get(message_id)).answer_prefix is None
    last = (await stream_types(app, message_id))[-1]
    assert last["event_type"] == "retry" and last["attempt"] == 2 and "cannot continue" in last["reason"]

    # Its result is the whole answer: nothing is put before it.
    result = GeneratedText(
        message_id=message_id, text="A whole answer", finish_reason="eos_token", generated_tokens=3
    )
    assert await lifecycle.complete("ws-old", result)
    assert (await lifecycle.get(message_id)).content == "A whole answer"


async def test_an_old_protocol_worker_gets_no_prefix(client, app, user, live_model):
    lifecycle = app.state.lifecycle
    message_id = (await start_chat(client, user, model=live_model)).assistant_id
    assert await lifecycle.claim(message_id, "ws-one", continues_answers=True) is not None
    await stream_tokens(app, message_id, "Half")
    await lifecycle.release(message_id, "ws-one", "worker lost")
    claimed = await lifecycle.claim(message_id, "ws-v4", continues_answers=True, protocol_version=4)
    assert claimed is not None and claimed.restarted and "answer_prefix" not in json.loads(claimed.frame)
    await lifecycle.fail(message_id, "test over")
