"""The chat API: listing, updating, deleting, branching, feedback and limits."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.api import (
    API,
    MAX_MESSAGE_LENGTH,
    MAX_MESSAGES_PER_CHAT,
    MAX_QUEUE_SIZE,
    answer,
    assert_error,
    finish_message,
    start_chat,
)
from tests.support.sql_statements import recorded_statements

pytestmark = API


async def list_all(client, user, **params) -> list[str]:
    response = await client.get("/chats", params=params, headers=user.headers)
    assert response.status_code == 200, response.text
    return [c["id"] for c in response.json()["chats"]]


# ---------------------------------------------------------------- listing


async def test_cursor_pagination_walks_both_ways(client, user):
    ids = []
    for i in range(5):
        ids.append(
            (await client.post("/chats", json={"title": f"chat {i}"}, headers=user.headers)).json()["id"]
        )
    newest_first = list(reversed(ids))

    page1 = (await client.get("/chats", params={"limit": 2}, headers=user.headers)).json()
    assert [c["id"] for c in page1["chats"]] == newest_first[:2]
    assert page1["prev"] is None and page1["next"]
    page2 = (
        await client.get("/chats", params={"limit": 2, "after": page1["next"]}, headers=user.headers)
    ).json()
    assert [c["id"] for c in page2["chats"]] == newest_first[2:4]
    assert page2["prev"] and page2["next"]
    page3 = (
        await client.get("/chats", params={"limit": 2, "after": page2["next"]}, headers=user.headers)
    ).json()
    assert [c["id"] for c in page3["chats"]] == newest_first[4:]
    assert page3["next"] is None and page3["prev"]
    # And back.
    back = (
        await client.get("/chats", params={"limit": 2, "before": page3["prev"]}, headers=user.headers)
    ).json()
    assert [c["id"] for c in back["chats"]] == newest_first[2:4]
    assert back["next"] and back["prev"]
    first = (
        await client.get("/chats", params={"limit": 2, "before": back["prev"]}, headers=user.headers)
    ).json()
    assert [c["id"] for c in first["chats"]] == newest_first[:2]
    assert first["prev"] is None and first["next"]
    # A new chat does not shift an existing cursor.
    await client.post("/chats", json={}, headers=user.headers)
    again = (
        await client.get("/chats", params={"limit": 2, "after": page1["next"]}, headers=user.headers)
    ).json()
    assert [c["id"] for c in again["chats"]] == newest_first[2:4]
    # Default page size is 10.
    assert len(await list_all(client, user)) == 6


async def test_list_shape_and_bad_parameters(client, user):
    chat = (await client.post("/chats", json={}, headers=user.headers)).json()
    body = (await client.get("/chats", headers=user.headers)).json()
    assert set(body) == {"chats", "next", "prev"}
    assert set(body["chats"][0]) == {
        "id",
        "created_at",
        "modified_at",
        "title",
        "hidden",
        "allow_data_use",
        "active_thread_tail_message_id",
    }
    assert body["chats"][0]["id"] == chat["id"]
    assert_error(
        await client.get("/chats", params={"after": "garbage!"}, headers=user.headers), 400, "invalid_cursor"
    )
    assert_error(await client.get("/chats", params={"after": "x", "before": "y"}, headers=user.headers), 400)
    for limit in (0, 101):
        assert_error(
            await client.get("/chats", params={"limit": limit}, headers=user.headers), 422, "validation_error"
        )


async def test_hidden_chats_are_listed_only_on_request(client, user):
    visible = (await client.post("/chats", json={}, headers=user.headers)).json()["id"]
    hidden = (await client.post("/chats", json={}, headers=user.headers)).json()["id"]
    response = await client.put(f"/chats/{hidden}", json={"hidden": True}, headers=user.headers)
    assert response.status_code == 200 and response.json()["hidden"] is True
    assert await list_all(client, user) == [visible]
    assert await list_all(client, user, include_hidden=True) == [hidden, visible]
    # Hidden chats stay readable.
    assert (await client.get(f"/chats/{hidden}", headers=user.headers)).status_code == 200


async def test_hide_all(client, user, other_user):
    for _ in range(3):
        await client.post("/chats", json={}, headers=user.headers)
    theirs = (await client.post("/chats", json={}, headers=other_user.headers)).json()["id"]
    assert (await client.put("/chats/hide_all", headers=user.headers)).status_code == 204
    assert (await client.post("/chats/hide_all", headers=user.headers)).status_code == 204
    assert await list_all(client, user) == []
    assert len(await list_all(client, user, include_hidden=True)) == 3
    assert await list_all(client, other_user) == [theirs]  # only the caller's chats
    assert_error(await client.put("/chats/hide_all"), 401)


# ---------------------------------------------------------------- updating


async def test_update_title_flags_and_active_thread(client, user, live_model, app):
    conv = await start_chat(client, user, "What is the tallest mountain?", model=live_model)
    chat = (await client.get(f"/chats/{conv.chat_id}", headers=user.headers)).json()
    assert chat["title"] == "What is the tallest mountain?"  # from the first prompt
    assert chat["active_thread_tail_message_id"] == conv.assistant_id  # follows the newest message

    put = await client.put(f"/chats/{conv.chat_id}", json={"title": "Mountains"}, headers=user.headers)
    assert put.status_code == 200 and put.json()["title"] == "Mountains"
    patch = await client.patch(
        f"/chats/{conv.chat_id}",
        json={"allow_data_use": False, "active_thread_tail_message_id": conv.prompter_id},
        headers=user.headers,
    )
    body = patch.json()
    assert body["allow_data_use"] is False and body["active_thread_tail_message_id"] == conv.prompter_id
    assert body["title"] == "Mountains" and body["hidden"] is False  # omitted fields stay
    assert body["modified_at"] >= chat["modified_at"]
    # An empty title clears it.
    cleared = await client.put(f"/chats/{conv.chat_id}", json={"title": "  "}, headers=user.headers)
    assert cleared.json()["title"] is None


async def test_update_failures(client, user, other_user):
    mine = (await client.post("/chats", json={}, headers=user.headers)).json()["id"]
    theirs = await start_chat(client, other_user)
    assert_error(
        await client.put(
            f"/chats/{mine}", json={"active_thread_tail_message_id": theirs.prompter_id}, headers=user.headers
        ),
        400,
        "message_not_in_chat",
    )
    assert_error(await client.put(f"/chats/{mine}", json={"title": "x" * 201}, headers=user.headers), 422)
    assert_error(await client.put(f"/chats/{mine}", json={"hidden": "maybe"}, headers=user.headers), 422)


# ---------------------------------------------------------------- deleting


async def test_delete_cancels_running_answers_then_deletes(client, user, live_model, app):
    conv = await start_chat(client, user, "Tell me a story", model=live_model)
    await client.post(
        f"/chats/{conv.chat_id}/messages/{conv.assistant_id}/votes", json={"score": 1}, headers=user.headers
    )
    response = await client.delete(f"/chats/{conv.chat_id}", headers=user.headers)
    assert response.status_code == 204
    assert_error(await client.get(f"/chats/{conv.chat_id}", headers=user.headers), 404, "chat_not_found")
    assert conv.chat_id not in await list_all(client, user, include_hidden=True)
    # The pending answer was cancelled before it went: its stream ends with a cancelled message.
    entries = await app.state.broker.read_events(f"events:{conv.assistant_id}", None, timeout=1)
    assert entries and '"state":"cancelled"' in entries[-1].data
    assert await app.state.lifecycle.get(conv.assistant_id) is None
    assert_error(await client.delete(f"/chats/{conv.chat_id}", headers=user.headers), 404)


# ---------------------------------------------------------------- branching


async def test_branching_never_cancels_siblings(client, user, live_model, app):
    conv = await start_chat(client, user, "Name a color", model=live_model)
    # "Regenerate": a second answer to the same prompt; the first keeps going.
    second = await answer(client, user, conv.chat_id, conv.prompter_id, live_model)
    messages = {
        m["id"]: m
        for m in (await client.get(f"/chats/{conv.chat_id}", headers=user.headers)).json()["messages"]
    }
    assert messages[conv.assistant_id]["state"] == "pending" and messages[second]["state"] == "pending"
    assert messages[second]["parent_id"] == messages[conv.assistant_id]["parent_id"] == conv.prompter_id

    # "Edit": two prompts under one finished answer.
    await finish_message(app, conv.assistant_id, "Blue.")
    edits = []
    for text in ("Why blue?", "Why not red?"):
        response = await client.post(
            f"/chats/{conv.chat_id}/prompter_message",
            json={"parent_id": conv.assistant_id, "content": text},
            headers=user.headers,
        )
        assert response.status_code == 200, response.text
        edits.append(response.json()["id"])
    chat = (await client.get(f"/chats/{conv.chat_id}", headers=user.headers)).json()
    assert chat["active_thread_tail_message_id"] == edits[-1]
    by_id = {m["id"]: m for m in chat["messages"]}
    assert {by_id[e]["parent_id"] for e in edits} == {conv.assistant_id}
    assert by_id[second]["state"] == "pending"  # still untouched
    # Answers to each branch.
    branch_answer = await answer(client, user, conv.chat_id, edits[0], live_model)
    assert (await client.get(f"/chats/{conv.chat_id}/messages/{branch_answer}", headers=user.headers)).json()[
        "parent_id"
    ] == edits[0]


async def test_tree_rules(client, user, live_model):
    conv = await start_chat(client, user, "Root", model=live_model)
    # One root per chat.
    root_again = await client.post(
        f"/chats/{conv.chat_id}/prompter_message", json={"content": "x"}, headers=user.headers
    )
    assert_error(root_again, 400, "parent_required")
    # A prompt answers an answer that has finished.
    early = await client.post(
        f"/chats/{conv.chat_id}/prompter_message",
        json={"parent_id": conv.assistant_id, "content": "x"},
        headers=user.headers,
    )
    assert_error(early, 400, "parent_not_complete")
    wrong = await client.post(
        f"/chats/{conv.chat_id}/assistant_message",
        json={"parent_id": conv.assistant_id, "model_config_name": live_model},
        headers=user.headers,
    )
    assert_error(wrong, 400, "parent_not_prompter")


# ---------------------------------------------------------------- feedback


async def test_votes(client, user, live_model):
    conv = await start_chat(client, user, model=live_model)
    url = f"/chats/{conv.chat_id}/messages/{conv.assistant_id}/votes"
    for score in (1, -1, 0, -1):
        assert (await client.post(url, json={"score": score}, headers=user.headers)).status_code == 204
    message = (
        await client.get(f"/chats/{conv.chat_id}/messages/{conv.assistant_id}", headers=user.headers)
    ).json()
    assert message["score"] == -1
    for bad in (2, -2, "up"):
        assert_error(
            await client.post(url, json={"score": bad}, headers=user.headers), 422, "validation_error"
        )
    prompt_vote = await client.post(
        f"/chats/{conv.chat_id}/messages/{conv.prompter_id}/votes", json={"score": 1}, headers=user.headers
    )
    assert_error(prompt_vote, 400, "not_assistant_message")


async def test_reports(client, user, live_model):
    conv = await start_chat(client, user, model=live_model)
    url = f"/chats/{conv.chat_id}/messages/{conv.assistant_id}/reports"
    assert (
        await client.post(url, json={"report_type": "spam", "reason": "ads"}, headers=user.headers)
    ).status_code == 204
    assert (
        await client.post(url, json={"report_type": "feedback", "reason": "wrong"}, headers=user.headers)
    ).status_code == 204
    chat = (await client.get(f"/chats/{conv.chat_id}", headers=user.headers)).json()
    reported = next(m for m in chat["messages"] if m["id"] == conv.assistant_id)
    assert reported["reports"] == ["spam", "feedback"]
    assert_error(
        await client.post(url, json={"report_type": "boring", "reason": ""}, headers=user.headers), 422
    )
    assert_error(
        await client.post(url, json={"report_type": "spam", "reason": "x" * 2001}, headers=user.headers), 422
    )
    on_prompt = await client.post(
        f"/chats/{conv.chat_id}/messages/{conv.prompter_id}/reports",
        json={"report_type": "spam"},
        headers=user.headers,
    )
    assert_error(on_prompt, 400, "not_assistant_message")


async def test_message_evaluations(client, user, live_model, app):
    conv = await start_chat(client, user, model=live_model)
    siblings = [await answer(client, user, conv.chat_id, conv.prompter_id, live_model) for _ in range(2)]
    url = f"/chats/{conv.chat_id}/messages/{conv.assistant_id}/message_evals"
    assert (
        await client.post(url, json={"inferior_message_ids": siblings}, headers=user.headers)
    ).status_code == 204

    from sqlalchemy import select

    from oasst_inference_server.db.models import DbMessageEvaluation

    async with app.state.session_factory() as session:
        rows = (
            (
                await session.exec(
                    select(DbMessageEvaluation).where(DbMessageEvaluation.chat_id == conv.chat_id)
                )
            )
            .scalars()
            .all()
        )
    assert [(r.selected_message_id, sorted(r.inferior_message_ids), r.user_id) for r in rows] == [
        (conv.assistant_id, sorted(siblings), user.id)
    ]
    # Not a sibling answer, itself, a prompt, or nothing at all.
    other = await start_chat(client, user, model=live_model)
    for ids, code in (
        ([other.assistant_id], "invalid_evaluation"),
        ([conv.assistant_id], "invalid_evaluation"),
        ([conv.prompter_id], "invalid_evaluation"),
    ):
        assert_error(
            await client.post(url, json={"inferior_message_ids": ids}, headers=user.headers), 400, code
        )
    assert_error(await client.post(url, json={"inferior_message_ids": []}, headers=user.headers), 422)
    on_prompt = f"/chats/{conv.chat_id}/messages/{conv.prompter_id}/message_evals"
    assert_error(
        await client.post(on_prompt, json={"inferior_message_ids": siblings}, headers=user.headers), 400
    )


# ---------------------------------------------------------------- limits


async def test_message_length_limit(client, user):
    chat_id = (await client.post("/chats", json={}, headers=user.headers)).json()["id"]
    too_long = await client.post(
        f"/chats/{chat_id}/prompter_message",
        json={"content": "x" * (MAX_MESSAGE_LENGTH + 1)},
        headers=user.headers,
    )
    assert_error(too_long, 422, "message_too_long")
    ok = await client.post(
        f"/chats/{chat_id}/prompter_message", json={"content": "x" * MAX_MESSAGE_LENGTH}, headers=user.headers
    )
    assert ok.status_code == 200


async def test_messages_per_chat_limit(client, user, live_model, app):
    conv = await start_chat(client, user, model=live_model)
    last_prompt, last_answer = conv.prompter_id, conv.assistant_id
    assert MAX_MESSAGES_PER_CHAT % 2 == 0
    for _ in range(MAX_MESSAGES_PER_CHAT // 2 - 1):
        await finish_message(app, last_answer)
        prompt = await client.post(
            f"/chats/{conv.chat_id}/prompter_message",
            json={"parent_id": last_answer, "content": "more"},
            headers=user.headers,
        )
        assert prompt.status_code == 200, prompt.text
        last_prompt = prompt.json()["id"]
        last_answer = await answer(client, user, conv.chat_id, last_prompt, live_model)
    await finish_message(app, last_answer)
    another_answer = await client.post(
        f"/chats/{conv.chat_id}/assistant_message",
        json={"parent_id": last_prompt, "model_config_name": live_model},
        headers=user.headers,
    )
    assert_error(another_answer, 409, "chat_full")
    another_prompt = await client.post(
        f"/chats/{conv.chat_id}/prompter_message",
        json={"parent_id": last_answer, "content": "one more"},
        headers=user.headers,
    )
    assert_error(another_prompt, 409, "chat_full")


async def test_queue_size_limit_gives_503_with_retry_after(client, user, live_model):
    chats = [await start_chat(client, user) for _ in range(MAX_QUEUE_SIZE + 1)]
    for conv in chats[:MAX_QUEUE_SIZE]:
        await answer(client, user, conv.chat_id, conv.prompter_id, live_model)
    last = chats[-1]
    full = await client.post(
        f"/chats/{last.chat_id}/assistant_message",
        json={"parent_id": last.prompter_id, "model_config_name": live_model},
        headers=user.headers,
    )
    assert_error(full, 503, "queue_full")
    assert int(full.headers["Retry-After"]) > 0
    # Cancelling one frees a place.
    first = chats[0]
    queued = (await client.get(f"/chats/{first.chat_id}", headers=user.headers)).json()["messages"][-1]
    await client.post(f"/chats/{first.chat_id}/messages/{queued['id']}/cancel", headers=user.headers)
    await asyncio.sleep(0)
    assert await answer(client, user, last.chat_id, last.prompter_id, live_model)


# ---------------------------------------------------------------- ownership


ROUTES = [
    ("GET", "/chats/{chat}", None),
    ("PUT", "/chats/{chat}", {"title": "x"}),
    ("PATCH", "/chats/{chat}", {"title": "x"}),
    ("DELETE", "/chats/{chat}", None),
    ("POST", "/chats/{chat}/prompter_message", {"parent_id": "{assistant}", "content": "hi"}),
    ("POST", "/chats/{chat}/assistant_message", {"parent_id": "{prompter}", "model_config_name": "{model}"}),
    ("GET", "/chats/{chat}/messages/{assistant}", None),
    ("POST", "/chats/{chat}/messages/{assistant}/cancel", None),
    ("GET", "/chats/{chat}/messages/{assistant}/events", None),
    ("POST", "/chats/{chat}/messages/{assistant}/votes", {"score": 1}),
    ("POST", "/chats/{chat}/messages/{assistant}/reports", {"report_type": "spam", "reason": "x"}),
    ("POST", "/chats/{chat}/messages/{assistant}/message_evals", {"inferior_message_ids": ["{assistant}"]}),
]


@pytest.mark.parametrize("method, template, body", ROUTES, ids=[f"{m} {t}" for m, t, _ in ROUTES])
async def test_another_user_gets_404_and_anonymous_401(
    client, user, other_user, live_model, method, template, body
):
    conv = await start_chat(client, user, model=live_model)
    values = {
        "chat": conv.chat_id,
        "prompter": conv.prompter_id,
        "assistant": conv.assistant_id,
        "model": live_model,
    }

    def fill(value):
        if isinstance(value, str):
            return value.format(**values)
        if isinstance(value, list):
            return [fill(v) for v in value]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        return value

    url = fill(template)
    kwargs = {"json": fill(body)} if body is not None else {}
    assert_error(await client.request(method, url, headers=other_user.headers, **kwargs), 404)
    assert_error(await client.request(method, url, **kwargs), 401, "not_authenticated")
    # Unknown ids are 404 for the owner too.
    unknown = url.replace(conv.chat_id, "00000000-0000-0000-0000-000000000000")
    assert_error(await client.request(method, unknown, headers=user.headers, **kwargs), 404)
    # And the owner still has the chat.
    assert (await client.get(f"/chats/{conv.chat_id}", headers=user.headers)).status_code == 200


async def test_a_prompt_counts_its_chat_once(client, app, user):
    """The capacity count also tells whether the chat is empty (a first prompt needs no parent): no
    second query asks it."""
    chat_id = (await client.post("/chats", json={}, headers=user.headers)).json()["id"]
    url = f"/chats/{chat_id}/prompter_message"
    with recorded_statements(app) as statements:
        first = await client.post(url, json={"content": "a"}, headers=user.headers)
        second = await client.post(url, json={"content": "b"}, headers=user.headers)
    assert first.status_code == 200, first.text
    assert_error(second, 400, "parent_required")  # the count saw the first prompt
    probes = [s for s in statements if s.startswith("SELECT message.id FROM message WHERE message.chat_id")]
    assert probes == []


async def test_an_events_request_looks_its_chat_and_message_up_in_one_query(
    client, app, user, other_user, live_model
):
    conv = await start_chat(client, user, model=live_model)
    other_chat = await start_chat(client, user, model=live_model)
    events = f"/chats/{conv.chat_id}/messages/{{}}/events"
    # The errors of the two lookups it replaces: whose chat, then whether the message is in it.
    assert_error(
        await client.get(events.format(conv.assistant_id), headers=other_user.headers), 404, "chat_not_found"
    )
    missing = "00000000-0000-0000-0000-000000000000"
    assert_error(await client.get(events.format(missing), headers=user.headers), 404, "message_not_found")
    elsewhere = events.format(other_chat.assistant_id)
    assert_error(await client.get(elsewhere, headers=user.headers), 404, "message_not_found")
    await finish_message(app, conv.assistant_id)
    with recorded_statements(app) as statements:
        response = await client.get(events.format(conv.assistant_id), headers=user.headers, timeout=30)
    assert response.status_code == 200, response.text
    assert '"event_type":"message"' in response.text
    lookups = [s for s in statements if s.startswith("SELECT") and "FROM chat" in s]
    assert len(lookups) == 1 and "JOIN message" in lookups[0]
    await finish_message(app, other_chat.assistant_id)
