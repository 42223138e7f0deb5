"""Message lifecycle guarantees, checked in-process on the real Postgres and Redis: a
message no frame can carry fails alone at claim time, the conversation is cut to the model's budget
before it is sent, backend refusals spend no attempt, a pending cancel wins over a late result, and a
reader resuming past a trimmed stream is told so."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import update

from oasst_inference_server import events
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.dispatch.work_frames import UnsendableMessage
from oasst_shared.chat_template import MAX_CHARS_PER_TOKEN
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import (
    MAX_FRAME_BYTES,
    MIN_SUPPORTED_PROTOCOL_VERSION,
    GeneratedText,
    Work,
    dump_frame,
    dump_work,
)
from tests.support.api import API, answer, finish_message, follow_up, set_content, start_chat

pytestmark = API


async def message(app, message_id: str) -> DbMessage:
    found = await app.state.lifecycle.get(message_id)
    assert found is not None
    return found


async def test_a_conversation_over_the_frame_limit_fails_alone_at_claim(client, app, user, live_model):
    big = await start_chat(client, user, "short for now", live_model)
    small = await start_chat(client, user, "an ordinary question", live_model)
    await set_content(app, big.prompter_id, "x" * (MAX_FRAME_BYTES + 1))
    lifecycle = app.state.lifecycle
    with pytest.raises(UnsendableMessage, match="frame limit"):
        await lifecycle.claim(big.assistant_id, "ws-test", max_input_tokens=SMOLLM2_135M.max_input_length)
    # The claim rolled back: the attempt is not spent, and only this message is affected.
    assert (await message(app, big.assistant_id)).state == "pending"
    assert (await message(app, big.assistant_id)).attempts == 0
    claimed = await lifecycle.claim(small.assistant_id, "ws-test", max_input_tokens=1536)
    assert claimed is not None
    work = claimed.work
    assert isinstance(work, Work) and work.thread[-1].content == "an ordinary question"
    assert claimed.frame == dump_frame(work)  # built once: checked, then sent as it is
    assert (await message(app, small.assistant_id)).generation_deadline is not None
    older = await start_chat(client, user, "from an older worker", live_model)
    claimed = await lifecycle.claim(
        older.assistant_id, "ws-old", protocol_version=MIN_SUPPORTED_PROTOCOL_VERSION
    )
    assert claimed is not None and isinstance(claimed.work, Work)
    assert (
        claimed.frame == dump_work(claimed.work, MIN_SUPPORTED_PROTOCOL_VERSION) != dump_frame(claimed.work)
    )


async def test_text_no_frame_may_carry_fails_at_claim(client, app, user, live_model):
    chat = await start_chat(client, user, "fine", live_model)
    # Postgres stores no NUL in a text column; a request payload (JSON) can hold one.
    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage)
            .where(DbMessage.id == chat.assistant_id)
            .values(
                kind="completion", request_payload={"thread": [{"role": "user", "content": "not \x00 fine"}]}
            )
        )
        await session.commit()
    with pytest.raises(UnsendableMessage, match="NUL"):
        await app.state.lifecycle.claim(chat.assistant_id, "ws-test", max_input_tokens=1536)


async def test_the_conversation_is_cut_to_the_model_s_budget_before_it_is_sent(client, app, user, live_model):
    chat = await start_chat(client, user, "first question", live_model)
    await finish_message(app, chat.assistant_id, "first answer")
    second = await follow_up(client, user, chat.chat_id, chat.assistant_id, "second question")
    answer_id = await answer(client, user, chat.chat_id, second, live_model)
    # The oldest turn alone is over a 100-token budget (in the server's generous character bound).
    await set_content(app, chat.prompter_id, "q" * (100 * MAX_CHARS_PER_TOKEN))
    claimed = await app.state.lifecycle.claim(answer_id, "ws-test", max_input_tokens=100)
    assert claimed is not None
    work = claimed.work
    assert isinstance(work, Work)
    assert [(t.role, t.content) for t in work.thread] == [
        ("assistant", "first answer"),
        ("user", "second question"),
    ]


async def test_a_backend_refusal_hands_the_message_back_without_spending_an_attempt(
    client, app, user, live_model
):
    chat = await start_chat(client, user, "anyone?", live_model)
    lifecycle = app.state.lifecycle
    assert await lifecycle.claim(chat.assistant_id, "ws-a") is not None
    await lifecycle.release(chat.assistant_id, "ws-a", "no free slot", backend_refused=True)
    refused = await message(app, chat.assistant_id)
    assert (refused.state, refused.attempts, refused.backend_refusals) == ("pending", 0, 1)
    assert refused.worker_session_id is None and refused.generation_deadline is None
    # A real failure still counts.
    assert await lifecycle.claim(chat.assistant_id, "ws-b") is not None
    await lifecycle.release(chat.assistant_id, "ws-b", "the backend dropped the stream")
    retried = await message(app, chat.assistant_id)
    assert (retried.state, retried.attempts) == ("pending", 1)


async def test_refusals_past_the_limit_count_as_attempts(client, app, user, live_model):
    chat = await start_chat(client, user, "again?", live_model)
    lifecycle = app.state.lifecycle
    limit = app.state.settings.max_backend_refusals
    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage).where(DbMessage.id == chat.assistant_id).values(backend_refusals=limit)
        )
        await session.commit()
    assert await lifecycle.claim(chat.assistant_id, "ws-a") is not None
    await lifecycle.release(chat.assistant_id, "ws-a", "no free slot", backend_refused=True)
    assert (await message(app, chat.assistant_id)).attempts == 1


async def test_a_message_running_when_backends_die_fails_at_the_limit_instead_of_moving_on(
    client, app, user, live_model
):
    chat = await start_chat(client, user, "the poison", live_model)
    lifecycle = app.state.lifecycle
    limit = app.state.settings.max_backend_deaths
    assert limit == 2  # the default: a message a crash interrupts is tried once more
    assert await lifecycle.claim(chat.assistant_id, "ws-a") is not None
    await lifecycle.release(chat.assistant_id, "ws-a", "the backend died", backend_died=True)
    once = await message(app, chat.assistant_id)
    assert (once.state, once.attempts, once.backend_deaths) == ("pending", 1, 1)
    assert await lifecycle.claim(chat.assistant_id, "ws-b") is not None
    await lifecycle.release(chat.assistant_id, "ws-b", "the backend died again", backend_died=True)
    poison = await message(app, chat.assistant_id)
    assert (poison.state, poison.attempts, poison.backend_deaths) == ("aborted_by_worker", 2, 2)
    assert "died 2 times" in (poison.error or "") and "the backend died again" in (poison.error or "")
    # It fails although attempts remain: no third backend gets it.
    assert poison.attempts < app.state.settings.max_attempts
    assert await lifecycle.claim(chat.assistant_id, "ws-c") is None


async def test_refusals_and_lost_workers_are_no_backend_deaths(client, app, user, live_model):
    chat = await start_chat(client, user, "innocent", live_model)
    lifecycle = app.state.lifecycle
    assert await lifecycle.claim(chat.assistant_id, "ws-a") is not None
    await lifecycle.release(chat.assistant_id, "ws-a", "no free slot", backend_refused=True)
    assert await lifecycle.claim(chat.assistant_id, "ws-b") is not None
    await lifecycle.release(chat.assistant_id, "ws-b", "worker lost")
    assert await lifecycle.claim(chat.assistant_id, "ws-c") is not None
    await lifecycle.release(chat.assistant_id, "ws-c", "the backend died", backend_died=True)
    survivor = await message(app, chat.assistant_id)
    assert (survivor.state, survivor.backend_deaths) == ("pending", 1)


async def test_a_result_after_a_cancel_request_is_stored_as_cancelled(client, app, user, live_model):
    chat = await start_chat(client, user, "stop me", live_model)
    lifecycle = app.state.lifecycle
    assert await lifecycle.claim(chat.assistant_id, "ws-a") is not None
    await lifecycle.request_cancel(await message(app, chat.assistant_id))
    assert await lifecycle.extend_leases("ws-a") == [chat.assistant_id]  # re-sent until answered
    result = GeneratedText(
        message_id=chat.assistant_id, text="all of it", finish_reason="length", generated_tokens=3
    )
    assert await lifecycle.complete("ws-a", result)
    done = await message(app, chat.assistant_id)
    assert done.state == "cancelled" and done.content == "all of it"
    assert await lifecycle.extend_leases("ws-a") == []


async def test_a_reader_resuming_past_a_trimmed_stream_gets_a_gap_event(client, app, user, live_model):
    chat = await start_chat(client, user, "long answer", live_model)
    broker = app.state.broker
    stream = events.stream_name(chat.assistant_id)
    first = await broker.append_event(stream, events.token_event("early"))
    maxlen = app.state.settings.stream_maxlen
    await broker.append_events([(stream, events.token_event(f" t{i}")) for i in range(maxlen * 2)])
    await app.state.lifecycle.fail(chat.assistant_id, "ended for the test")
    response = await client.get(
        f"/chats/{chat.chat_id}/messages/{chat.assistant_id}/events",
        headers={**user.headers, "Last-Event-ID": first},
        timeout=30,
    )
    data = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
    assert data and data[0]["event_type"] == "gap" and "trimmed" in data[0]["detail"], data[:2]
    assert data[-1]["event_type"] == "error"
    # Resuming from a kept event is no gap.
    kept = [line[4:].strip() for line in response.text.splitlines() if line.startswith("id:")]
    again = await client.get(
        f"/chats/{chat.chat_id}/messages/{chat.assistant_id}/events",
        headers={**user.headers, "Last-Event-ID": kept[-2]},
        timeout=30,
    )
    assert '"gap"' not in again.text and '"error"' in again.text


async def test_a_cancel_that_races_a_claim_still_stops_the_worker(client, app, user, live_model):
    chat = await start_chat(client, user, "cancel me", live_model)
    lifecycle, broker = app.state.lifecycle, app.state.broker
    seen_pending = await message(app, chat.assistant_id)  # the cancel request read it as pending...
    async with broker.subscribe_commands(events.worker_command_channel("ws-racer")) as commands:
        assert await lifecycle.claim(chat.assistant_id, "ws-racer") is not None  # ...then a worker took it
        await lifecycle.request_cancel(seen_pending)
        command = await asyncio.wait_for(anext(aiter(commands)), 5)
    assert json.loads(command) == {"type": "cancel", "message_id": chat.assistant_id}
    assert (await message(app, chat.assistant_id)).state == "cancelled"
    # The racer's pongs keep asking it to stop until it answers.
    assert await lifecycle.extend_leases("ws-racer", [chat.assistant_id]) == [chat.assistant_id]


async def test_the_claim_sets_the_generation_deadline_from_the_hints_max_new_tokens(
    client, app, user, live_model
):
    """Given the max_new_tokens the hint carried, the claim's one UPDATE sets the generation deadline;
    a number that is not the message's (or none) is corrected before the claim commits."""
    settings, lifecycle = app.state.settings, app.state.lifecycle
    for told in ("right", "wrong", None):
        chat = await start_chat(client, user, f"deadline {told}", live_model)
        asked = (await message(app, chat.assistant_id)).sampling_parameters["max_new_tokens"]
        guess = {"right": asked, "wrong": asked + 1000, None: None}[told]
        claimed = await lifecycle.claim(chat.assistant_id, "ws-test", max_new_tokens=guess)
        assert claimed is not None and isinstance(claimed.work, Work)
        assert claimed.work.sampling_parameters.max_new_tokens == asked
        claimed = await message(app, chat.assistant_id)
        assert claimed.generation_deadline is not None and claimed.started_at is not None
        seconds = (claimed.generation_deadline - claimed.started_at).total_seconds()
        assert seconds == pytest.approx(settings.in_progress_bound(asked)), told


async def test_an_embedding_s_time_bound_grows_with_its_inputs(app):
    """2,048 inputs take minutes on a small CPU: the in-progress bound counts one unit per input (it was
    the bare grace, and a long embedding was cancelled and retried over and over)."""
    settings, lifecycle = app.state.settings, app.state.lifecycle
    for inputs in (1, 2048):
        embedding = DbMessage(
            kind="embedding",
            role="assistant",
            state="pending",
            model_config_name="an-encoder",
            request_payload={"inputs": ["text"] * inputs},
        )
        async with app.state.session_factory() as session:
            session.add(embedding)
            await session.commit()
        claimed = await lifecycle.claim(embedding.id, "ws-test", max_new_tokens=0)  # the ticket's hint
        assert claimed is not None and claimed.work_units == inputs
        stored = await message(app, embedding.id)
        assert stored.generation_deadline is not None and stored.started_at is not None
        seconds = (stored.generation_deadline - stored.started_at).total_seconds()
        assert seconds == pytest.approx(settings.in_progress_bound(inputs))
