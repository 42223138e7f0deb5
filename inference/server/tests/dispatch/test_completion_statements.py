"""A worker's result is stored in one statement, on both stores: the UPDATE that ends the message returns
it (no read before or after; on Postgres straight on asyncpg), and a cancel asked meanwhile still wins in that statement. A message holding
a continued answer's start is read first, in the same transaction (test_continuation covers its text).
Its usage is charged to the user its fair-queue ticket names, without reading its chat."""

from __future__ import annotations

from typing import Any

import pytest

from oasst_shared.protocol import GeneratedText
from tests.support import store_apps
from tests.support.api import API, start_chat
from tests.support.sql_statements import recorded_statements

pytestmark = API

store, app, client, user, model = store_apps.FIXTURES


@pytest.fixture(scope="module")
def app_settings() -> dict[str, Any]:
    return {}


def message_statements(statements: list[str]) -> list[str]:
    """The verbs of the statements on the message table (the usage charger reads a chat's owner apart); an
    update whose rows are locked first in a ``WITH`` (``dispatch.answer_ends``) is an UPDATE."""
    verbs = []
    for s in statements:
        if s.startswith("WITH ") and " UPDATE message " in s:
            verbs.append("UPDATE")
        elif s.startswith("UPDATE message ") or " FROM message " in f"{s} ":
            verbs.append(s.split()[0])
    return verbs


def result(message_id: str, text: str) -> GeneratedText:
    return GeneratedText(message_id=message_id, text=text, finish_reason="length", generated_tokens=2)


async def test_a_result_is_stored_in_one_statement(store, client, app, user, model) -> None:
    chat = await start_chat(client, user, "hello", model)
    lifecycle = app.state.lifecycle
    assert await lifecycle.claim(chat.assistant_id, "ws-one") is not None
    with recorded_statements(app) as statements:
        assert await lifecycle.complete("ws-one", result(chat.assistant_id, "two words"))
    assert message_statements(statements) == ["UPDATE"], statements
    assert any("UPDATE message " in s and "RETURNING" in s for s in statements), statements
    # On Postgres, in SQL of its own on the asyncpg connection (dispatch.answer_ends), not the ORM's.
    assert bool(statements.driver) == store["database_url"].startswith("postgres"), statements
    # Its usage is charged to the chat's owner, whom its ticket names: the chat is not read for it.
    assert not [s for s in statements if " FROM chat " in f"{s} "], statements
    done = await lifecycle.get(chat.assistant_id)
    assert (done.state, done.content, done.generated_tokens) == ("complete", "two words", 2)


async def test_a_cancel_asked_meanwhile_wins_in_that_statement(client, app, user, model) -> None:
    chat = await start_chat(client, user, "stop me", model)
    lifecycle = app.state.lifecycle
    assert await lifecycle.claim(chat.assistant_id, "ws-two") is not None
    await lifecycle.request_cancel(await lifecycle.get(chat.assistant_id))
    with recorded_statements(app) as statements:
        assert await lifecycle.complete("ws-two", result(chat.assistant_id, "all of it"))
    assert message_statements(statements) == ["UPDATE"], statements
    done = await lifecycle.get(chat.assistant_id)
    assert (done.state, done.content) == ("cancelled", "all of it")


async def test_a_stale_session_s_result_is_ignored(client, app, user, model) -> None:
    chat = await start_chat(client, user, "mine", model)
    lifecycle = app.state.lifecycle
    assert await lifecycle.claim(chat.assistant_id, "ws-owner") is not None
    assert not await lifecycle.complete("ws-stale", result(chat.assistant_id, "not mine"))
    kept = await lifecycle.get(chat.assistant_id)
    assert (kept.state, kept.content) == ("in_progress", None)
