"""What an answered OpenAI-API request leaves in the database (``OpenAIService.scrub``), in one statement:
its results always go; without ``store_api_conversations`` its prompt and answer go too, unless it was
kept as a chat; the user's older requests left behind are swept with it; nothing else is touched."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from oasst_inference_server.db.models import DbChat, DbMessage, utcnow
from oasst_inference_server.openai_api.openai_service import OpenAIService
from tests.support.api import API
from tests.support.sql_statements import recorded_statements

pytestmark = API


async def add(app, **fields: Any) -> DbMessage:
    values: dict[str, Any] = {
        "kind": "completion",
        "role": "assistant",
        "state": "complete",
        "content": "the answer",
        "system_prompt": "be brief",
        "request_payload": {"thread": [{"role": "user", "content": "the question"}]},
        "result_payload": {"tool_calls": []},
        "generated_tokens": 3,
        "prompt_tokens": 5,
        "finished_at": utcnow(),
        **fields,
    }
    message = DbMessage(**values)
    async with app.state.session_factory() as session:
        session.add(message)
        await session.commit()
    return message


async def stored(app, message: DbMessage) -> tuple[Any, ...]:
    current = await app.state.lifecycle.get(message.id)
    assert current is not None
    return (
        current.content,
        current.system_prompt,
        current.request_payload,
        current.result_payload,
        current.generated_tokens,
    )


async def chat_of(app, user_id: str) -> str:
    chat = DbChat(user_id=user_id)
    async with app.state.session_factory() as session:
        session.add(chat)
        await session.commit()
    return chat.id


@pytest.mark.parametrize("store", [False, True])
async def test_an_answered_request_keeps_only_its_usage(app, user, other_user, store) -> None:
    service: OpenAIService = app.state.openai_service
    if store:
        service = OpenAIService(
            app.state.settings.model_copy(update={"store_api_conversations": True}),
            app.state.session_factory,
            app.state.stream_fanout,
            app.state.message_reads,
            app.state.lifecycle,
            app.state.registry,
            app.state.submission,
        )
    answered = await add(app, user_id=user.id)
    old = utcnow() - timedelta(hours=1)
    left_behind = await add(app, user_id=user.id, finished_at=old)
    recent = await add(app, user_id=user.id)  # another request, maybe still being read
    running = await add(app, user_id=user.id, state="in_progress", finished_at=None)
    kept = await add(app, user_id=user.id, chat_id=await chat_of(app, user.id), finished_at=old)
    others = await add(app, user_id=other_user.id)

    with recorded_statements(app) as statements:
        await service.scrub(answered)
    # One statement: an UPDATE whose rows are locked first, in the order of their ids.
    assert len(statements) == 1 and " UPDATE message SET " in statements[0], statements
    assert statements.driver == statements, statements  # Postgres: SQL of its own on asyncpg (db.driver)

    whole = ("the answer", "be brief", {"thread": [{"role": "user", "content": "the question"}]})
    erased = whole if store else (None, None, None)
    assert await stored(app, answered) == (*erased, None, 3)
    assert await stored(app, left_behind) == (*erased, None, 3)
    assert await stored(app, kept) == (*whole, None, 3)  # kept as a chat: its text stays
    for untouched in (recent, running, others):
        assert await stored(app, untouched) == (*whole, {"tool_calls": []}, 3)


async def test_scrubs_asked_together_share_statements(app, user, other_user) -> None:
    service: OpenAIService = app.state.openai_service
    answered = [await add(app, user_id=(user if i % 2 else other_user).id) for i in range(12)]
    with recorded_statements(app) as statements:
        await asyncio.gather(*(service.scrub(message) for message in answered))
    # Those asked while one statement ran shared the next (a burst of answers ending at once).
    assert 1 <= len(statements) < len(answered), statements
    for message in answered:
        assert await stored(app, message) == (None, None, None, None, 3)
