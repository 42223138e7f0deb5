"""Admission counts what a request starts, and holds under simultaneous requests, on both stores.

A ``/v1`` request with ``n`` choices starts ``n`` generations: the per-user limits count all of them,
and refuse the request whole (429) when they would pass a limit, or with a 400 when ``n`` alone is over
one. Simultaneous requests of one user are admitted one at a time (Postgres: the user's row lock;
SQLite: the user's turn in the one server process), so a burst cannot pass the limit.

Apps of this module: 6 generations at once and 10 per minute per user, on Postgres with Redis and on
SQLite with the in-process broker; their model's worker session never takes work, so every admitted
generation stays running (pending) until the test answers it as a worker would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlmodel import select

from oasst_inference_server.db.models import DbChat, DbMessage
from oasst_shared.schemas import MessageState
from tests.support import store_apps
from tests.support.api import (
    API,
    Conversation,
    User,
    finish_message,
    sign_in,
    start_chat,
)
from tests.support.store_apps import refused

pytestmark = API

store, app, client, user, model = store_apps.FIXTURES  # the module's own two apps

AT_ONCE = 6  # below the most choices a request may ask for (8), so n alone can be over it
PER_MINUTE = 10


@pytest.fixture(scope="module")
def app_settings() -> dict[str, Any]:
    return {"max_concurrent_generations_per_user": AT_ONCE, "rate_limit_per_minute": PER_MINUTE}


async def running_ids(app, user: User) -> list[str]:
    """The user's pending and in-progress generations, API requests and chat answers alike."""
    active = (MessageState.pending, MessageState.in_progress)
    async with app.state.session_factory() as session:
        direct = select(DbMessage.id).where(DbMessage.user_id == user.id, DbMessage.state.in_(active))
        in_chats = (
            select(DbMessage.id)
            .join(DbChat, DbChat.id == DbMessage.chat_id)
            .where(DbChat.user_id == user.id, DbMessage.state.in_(active))
        )
        return list((await session.exec(direct)).all()) + list((await session.exec(in_chats)).all())


async def running(app, user: User) -> int:
    return len(await running_ids(app, user))


def completion(model: str, n: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": n}


@contextlib.asynccontextmanager
async def admitted(client, app, user: User, body: dict[str, Any], expect_running: int) -> AsyncIterator[None]:
    """A /v1 request that is admitted and then waits for its answers, held until the block ends; then
    every running generation of the user is answered (as a worker would) and the request's answer read."""
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=user.headers))
    try:
        for _ in range(500):
            if task.done():
                pytest.fail(f"the request was answered: {task.result().status_code} {task.result().text}")
            if await running(app, user) == expect_running:
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail(f"{await running(app, user)} generations running, not {expect_running}")
        yield
        assert not task.done()
    finally:
        for message_id in await running_ids(app, user):
            await finish_message(app, message_id)
    response = await task
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == body["n"]


async def test_n_choices_count_n_against_the_generations_at_once(client, app, user, model) -> None:
    for _ in range(AT_ONCE - 2):
        await start_chat(client, user, model=model)  # chat answers share the budget
    assert await running(app, user) == AT_ONCE - 2
    # 4 running and 3 more would be 7: refused whole, nothing of it stored.
    too_many = await client.post("/v1/chat/completions", json=completion(model, 3), headers=user.headers)
    refused(too_many, 429, "too_many_concurrent_generations")
    assert int(too_many.headers["Retry-After"]) >= 1
    assert await running(app, user) == AT_ONCE - 2
    async with admitted(client, app, user, completion(model, 2), expect_running=AT_ONCE):
        # The limit is reached by the two choices: a third generation of any kind is refused.
        one_more = await client.post("/v1/chat/completions", json=completion(model, 1), headers=user.headers)
        refused(one_more, 429, "too_many_concurrent_generations")
        chat = await client.post(
            "/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 2}, headers=user.headers
        )
        refused(chat, 429, "too_many_concurrent_generations")


async def test_n_choices_count_n_per_minute(client, app, user, model) -> None:
    async with admitted(client, app, user, completion(model, AT_ONCE), expect_running=AT_ONCE):
        pass
    # Answered: no longer running, but in the minute's count.
    # 6 in the minute and 5 more would be 11 of 10: refused whole; 4 more fit.
    over = await client.post("/v1/chat/completions", json=completion(model, 5), headers=user.headers)
    error = refused(over, 429, "rate_limited")
    assert "starts 5" in error["message"]
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    async with admitted(client, app, user, completion(model, PER_MINUTE - AT_ONCE), expect_running=4):
        pass


async def test_n_over_a_limit_is_refused_as_it_is(client, app, user, model) -> None:
    """A 429 would have the client retry a request that can never pass: a 400 naming n."""
    response = await client.post(
        "/v1/chat/completions", json=completion(model, AT_ONCE + 1), headers=user.headers
    )
    error = refused(response, 400, "too_many_choices")
    assert error["param"] == "n" and str(AT_ONCE) in error["message"]
    assert await running(app, user) == 0


async def test_simultaneous_requests_of_one_user_pass_no_limit(client, app, model) -> None:
    """20 answers asked at once, 6 allowed: exactly 6 start, every time (SQLite too)."""
    for _ in range(3):
        user = await sign_in(client)
        conversation = await start_chat(client, user)  # a prompt, no answer yet

        async def ask(user: User, conversation: Conversation) -> int:
            response = await client.post(
                f"/chats/{conversation.chat_id}/assistant_message",
                json={"parent_id": conversation.prompter_id, "model_config_name": model},
                headers=user.headers,
            )
            assert response.status_code in (200, 429), response.text
            return response.status_code

        statuses = await asyncio.gather(*(ask(user, conversation) for _ in range(20)))
        assert statuses.count(200) == AT_ONCE, statuses
        assert await running(app, user) == AT_ONCE
    assert app.state.submission.turns.held() == 0  # every turn was given back
