"""The work frame of a submission is known when it is submitted: a request whose work would be a frame
over ``MAX_FRAME_BYTES`` is refused there with 413, on both APIs, and nothing of it is stored (it used
to be accepted and then fail with a 500, or fail at its claim). The conversation is measured as the
claim sends it: cut to the model's input budget."""

from __future__ import annotations

import uuid

from sqlalchemy import func
from sqlmodel import select

from oasst_inference_server.broker import WorkerSession
from oasst_inference_server.db.models import DbMessage
from oasst_shared.model_configs import MINILM_EMBEDDING, SMOLLM2_135M
from oasst_shared.protocol import MAX_FRAME_BYTES, WorkerCapabilities
from oasst_shared.tool_calls import MAX_TOOLS
from tests.support.api import API, answer, assert_error, finish_message, follow_up, set_content, start_chat

pytestmark = API


async def live_model(app, *, embedding: bool = False, max_input_length: int | None = None) -> str:
    """A model with a worker session that takes no work: tools allowed, and the input budget given."""
    name = f"frame-model-{uuid.uuid4().hex[:6]}"
    config = (MINILM_EMBEDDING if embedding else SMOLLM2_135M).model_copy(update={"name": name})
    if max_input_length is not None:
        config = config.model_copy(
            update={"max_input_length": max_input_length, "max_total_length": max_input_length + 512}
        )
    session = WorkerSession(
        model_config=config,
        max_parallel_requests=2,
        free_slots=0,
        backend_kind="fake",
        worker_version="test",
        connected_at=0.0,
        capabilities=WorkerCapabilities(tools=True),
    )
    await app.state.broker.put_worker_session(session.record(f"ws-{uuid.uuid4().hex[:8]}"), ttl=3600)
    return name


async def stored_messages(app, user) -> int:
    """Every message in the database (the tests of a session run one at a time)."""
    async with app.state.session_factory() as session:
        return int((await session.exec(select(func.count()).select_from(DbMessage))).one())


def openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


async def test_many_long_tools_are_refused_at_submission_with_413(client, app, user):
    model = await live_model(app)
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 8192, "parameters": {}}}
        for i in range(MAX_TOOLS)
    ]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": tools}
    before = await stored_messages(app, user)
    error = openai_error(await client.post("/v1/chat/completions", json=body, headers=user.headers), 413)
    assert error["code"] == "request_too_large" and error["param"] == "tools", error
    assert str(MAX_FRAME_BYTES) in error["message"] and error["type"] == "invalid_request_error"
    for stream in (True, False):
        response = await client.post(
            "/v1/chat/completions", json={**body, "stream": stream}, headers=user.headers
        )
        assert response.status_code == 413, response.text
    assert await stored_messages(app, user) == before  # nothing stored, nothing queued


async def test_embedding_inputs_over_a_frame_are_refused_with_413(client, app, user):
    model = await live_model(app, embedding=True)
    # 200,000 characters are within the request's bounds, but each control character is six bytes in
    # a frame (\u0001): 1.2 MB.
    body = {"model": model, "input": ["\x01" * 1000] * 200}
    before = await stored_messages(app, user)
    error = openai_error(await client.post("/v1/embeddings", json=body, headers=user.headers), 413)
    assert error["code"] == "request_too_large" and error["param"] == "input", error
    assert await stored_messages(app, user) == before


async def test_a_long_conversation_is_measured_as_the_claim_cuts_it(client, app, user):
    small = await live_model(app)  # SmolLM2's budget: 1,536 tokens
    large = await live_model(app, max_input_length=200_000)
    chat = await start_chat(client, user, "the first question", small)
    # An old turn of 1.2 MB as a frame (a control character takes six bytes there).
    await set_content(app, chat.prompter_id, "\x01" * 200_000)
    await finish_message(app, chat.assistant_id, "the first answer")
    second = await follow_up(client, user, chat.chat_id, chat.assistant_id, "a short follow-up")
    # The small model's budget leaves the old turn out of the frame: accepted.
    small_answer = await answer(client, user, chat.chat_id, second, small)
    await finish_message(app, small_answer, "the second answer")
    # The large model's would send it all: refused, and nothing stored.
    before = await stored_messages(app, user)
    response = await client.post(
        f"/chats/{chat.chat_id}/assistant_message",
        json={"parent_id": second, "model_config_name": large},
        headers=user.headers,
    )
    body = assert_error(response, 413, "request_too_large")
    assert "the conversation" in body["detail"] and str(MAX_FRAME_BYTES) in body["detail"]
    assert await stored_messages(app, user) == before
    turn = await client.post(
        f"/chats/{chat.chat_id}/turns",
        json={"parent_id": small_answer, "content": "and one more", "model_config_name": large},
        headers=user.headers,
    )
    assert_error(turn, 413, "request_too_large")
    assert await stored_messages(app, user) == before  # neither the prompt nor its answer


async def test_a_conversation_just_under_the_limit_is_accepted(client, app, user):
    large = await live_model(app, max_input_length=200_000)
    chat = await start_chat(client, user, "short", None)
    await set_content(app, chat.prompter_id, "a" * (MAX_FRAME_BYTES - 2000))
    message_id = await answer(client, user, chat.chat_id, chat.prompter_id, large)
    claimed = await app.state.lifecycle.claim(message_id, "ws-frame", max_input_tokens=200_000)
    assert claimed is not None and len(claimed.frame) <= MAX_FRAME_BYTES
