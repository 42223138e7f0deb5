"""Scheduling through the API: tiers (admin), queue-timeout and priority headers, the queue positions
readers are sent, and the operators' queue view."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import update

from oasst_inference_server import events
from oasst_inference_server.broker import WorkerSessionRecord
from oasst_inference_server.db.models import DbMessage, utcnow
from oasst_inference_server.dispatch.recovery import RecoveryLoop
from oasst_inference_server.scheduling import fair_share
from tests.support.api import ADMIN, API, answer, assert_error, start_chat, trusted_header

pytestmark = API


async def _ticket(app, message_id: str) -> dict:
    async with app.state.session_factory() as session:
        message = await session.get(DbMessage, message_id)
        assert message is not None and message.scheduling is not None
        return dict(message.scheduling)


async def test_admin_sets_a_tier_that_weighs_the_user_s_next_messages(client, app, user, live_model):
    assert (await client.get(f"/admin/users/{user.id}", headers=ADMIN)).json()["tier"] is None
    before = await start_chat(client, user, model=live_model)
    assert (await _ticket(app, before.assistant_id))["weight"] == 1.0  # the default tier, "standard"
    assert_error(
        await client.put(f"/admin/users/{user.id}/tier", json={"tier": "gold"}, headers=ADMIN),
        422,
        "unknown_tier",
    )
    updated = await client.put(f"/admin/users/{user.id}/tier", json={"tier": "priority"}, headers=ADMIN)
    assert updated.status_code == 200 and updated.json()["tier"] == "priority"
    after = await answer(client, user, before.chat_id, before.prompter_id, live_model)
    ticket = await _ticket(app, after)
    assert ticket["weight"] == 2.0 and ticket["user"] == user.id
    assert ticket["max_new_tokens"] == 1024 and ticket["prompt_tokens"] >= 1
    assert (await client.put(f"/admin/users/{user.id}/tier", json={"tier": None}, headers=ADMIN)).json()[
        "tier"
    ] is None
    for message_id in (before.assistant_id, after):
        await client.post(f"/chats/{before.chat_id}/messages/{message_id}/cancel", headers=user.headers)


async def test_queue_timeout_and_priority_headers_are_checked(client, app, user, live_model):
    conv = await start_chat(client, user)
    url = f"/chats/{conv.chat_id}/assistant_message"
    body = {"parent_id": conv.prompter_id, "model_config_name": live_model}
    for bad in ("0", "-1", "nan", "soon", "100000"):
        assert_error(
            await client.post(url, json=body, headers={**user.headers, "X-Queue-Timeout": bad}),
            422,
            "invalid_queue_timeout",
        )
    # Only trusted clients may set a priority.
    assert_error(
        await client.post(url, json=body, headers={**user.headers, "X-Priority": "1"}),
        403,
        "priority_not_allowed",
    )
    made = await client.post(url, json=body, headers={**user.headers, "X-Queue-Timeout": "30"})
    assert made.status_code == 200, made.text
    assert (await _ticket(app, made.json()["id"]))["queue_timeout"] == 30.0
    await client.post(f"/chats/{conv.chat_id}/messages/{made.json()['id']}/cancel", headers=user.headers)

    web = trusted_header()
    chat = (await client.post("/chats", json={}, headers=web)).json()["id"]
    prompt = (
        await client.post(f"/chats/{chat}/prompter_message", json={"content": "hi"}, headers=web)
    ).json()["id"]
    body = {"parent_id": prompt, "model_config_name": live_model}
    assert_error(
        await client.post(f"/chats/{chat}/assistant_message", json=body, headers={**web, "X-Priority": "9"}),
        422,
        "invalid_priority",
    )
    made = await client.post(
        f"/chats/{chat}/assistant_message", json=body, headers={**web, "X-Priority": "-1"}
    )
    assert made.status_code == 200, made.text
    ticket = await _ticket(app, made.json()["id"])
    assert ticket["priority"] == -1 and ticket["weight"] == 0.5
    await client.post(f"/chats/{chat}/messages/{made.json()['id']}/cancel", headers=web)


async def test_queue_positions_sent_to_readers_match_the_dispatch_order(client, app, login, live_model):
    heavy, light = await login(), await login()
    convs = [await start_chat(client, heavy, model=live_model) for _ in range(3)]
    convs.append(await start_chat(client, light, model=live_model))
    ids = [c.assistant_id for c in convs]
    lifecycle, broker = app.state.lifecycle, app.state.broker
    queue = events.work_queue_name(live_model)
    dispatched: list[str] = []
    while True:
        positions = {}
        for message_id in ids:
            message = await lifecycle.get(message_id)
            if message.state == "pending" and message_id not in dispatched:
                position, size, wait = await app.state.message_reads.queue_position(message)
                positions[position] = message_id
                assert size == len(ids) - len(dispatched) and wait is not None and wait >= 0
        if not positions:
            break
        assert sorted(positions) == list(range(1, len(positions) + 1))
        popped = await broker.pop_work(queue, 0)  # what a dispatcher would take next
        assert popped == positions[1]
        dispatched.append(popped)
    # The light user's one message went ahead of at least one of the heavy user's three.
    assert dispatched.index(convs[3].assistant_id) < 3
    for conv, user in zip(convs, [heavy, heavy, heavy, light], strict=True):
        await client.post(f"/chats/{conv.chat_id}/messages/{conv.assistant_id}/cancel", headers=user.headers)


async def test_operators_see_depth_backlog_and_workers(client, app, login, live_model):
    heavy, light = await login(), await login()
    convs = [await start_chat(client, heavy, model=live_model) for _ in range(2)]
    convs.append(await start_chat(client, light, model=live_model))
    status = await client.get("/admin/queues", headers=ADMIN)
    assert status.status_code == 200, status.text
    model = next(m for m in status.json()["models"] if m["model_config_name"] == live_model)
    assert model["depth"] == 3 and model["oldest_wait_seconds"] >= 0
    backlog = {b["user_id"]: b["waiting"] for b in model["backlog"]}
    assert backlog == {heavy.id: 2, light.id: 1}
    assert [w["max_parallel_requests"] for w in model["workers"]] == [2]
    metrics = (await client.get("/metrics")).text
    assert f'oasst_server_user_backlog{{model="{live_model}",user="{heavy.id}"}} 2.0' in metrics
    assert f'oasst_server_queue_depth{{model="{live_model}"}} 3.0' in metrics
    for conv, user in zip(convs, [heavy, heavy, light], strict=True):
        await client.post(f"/chats/{conv.chat_id}/messages/{conv.assistant_id}/cancel", headers=user.headers)


async def test_a_message_past_its_queue_timeout_fails_with_a_clear_error(client, app, user, live_model):
    conv = await start_chat(client, user)
    url = f"/chats/{conv.chat_id}/assistant_message"
    body = {"parent_id": conv.prompter_id, "model_config_name": live_model}
    short = (await client.post(url, json=body, headers={**user.headers, "X-Queue-Timeout": "5"})).json()["id"]
    default = await answer(client, user, conv.chat_id, conv.prompter_id, live_model)
    async with app.state.session_factory() as session:  # both have waited 10 s
        await session.exec(
            update(DbMessage)
            .where(DbMessage.id.in_([short, default]))
            .values(enqueued_at=utcnow() - timedelta(seconds=10))
        )
        await session.commit()
    recovery = RecoveryLoop(
        app.state.session_factory,
        app.state.broker,
        app.state.lifecycle,
        app.state.registry,
        app.state.settings,
    )
    await recovery.fail_overdue()
    failed = await app.state.lifecycle.get(short)
    assert failed.state == "failed" and "queue timeout of 5s" in failed.error
    assert short not in await app.state.broker.queued_ids(events.work_queue_name(live_model))
    assert (await app.state.lifecycle.get(default)).state == "pending"  # queue_timeout (600 s) not reached
    await client.post(f"/chats/{conv.chat_id}/messages/{default}/cancel", headers=user.headers)


async def test_a_full_queue_of_one_model_does_not_stop_another(client, app, login, live_model):
    other_model = f"{live_model}-other"
    config = app.state.settings  # the second model gets a worker session like live_model's
    sessions = await app.state.broker.list_worker_sessions()
    record = next(r for r in sessions if r.model_config_name == live_model)
    data = json.loads(record.data)
    data["model_config"]["name"] = other_model
    await app.state.broker.put_worker_session(
        WorkerSessionRecord(record.session_id + "-other", other_model, json.dumps(data)), ttl=3600
    )
    user = await login()
    full = [await start_chat(client, user, model=live_model) for _ in range(config.max_queue_size)]
    conv = await start_chat(client, user)
    refused = await client.post(
        f"/chats/{conv.chat_id}/assistant_message",
        json={"parent_id": conv.prompter_id, "model_config_name": live_model},
        headers=user.headers,
    )
    assert_error(refused, 503, "queue_full")
    accepted = await answer(client, user, conv.chat_id, conv.prompter_id, other_model)
    other_queue = await app.state.broker.queued_ids(events.work_queue_name(other_model))
    assert other_queue == [accepted]  # nothing of the full model's queue crossed over
    message = await app.state.lifecycle.get(accepted)
    assert (await app.state.message_reads.queue_position(message))[:2] == (1, 1)
    for c in full:
        await client.post(f"/chats/{c.chat_id}/messages/{c.assistant_id}/cancel", headers=user.headers)
    await client.post(f"/chats/{conv.chat_id}/messages/{accepted}/cancel", headers=user.headers)


async def test_an_answers_ticket_counts_the_chats_text_and_its_system_prompt(client, app, user, live_model):
    """Admission measures the chat once; the ticket's prompt estimate is what a query of its own
    finds (as on a re-queue): every message's text plus the system prompt, at 4 characters a token."""
    conv = await start_chat(client, user, "x" * 400)
    response = await client.post(
        f"/chats/{conv.chat_id}/assistant_message",
        json={"parent_id": conv.prompter_id, "model_config_name": live_model, "system_prompt": "s" * 40},
        headers=user.headers,
    )
    assert response.status_code == 200, response.text
    message_id = response.json()["id"]
    ticket = await _ticket(app, message_id)
    assert ticket["prompt_tokens"] == (400 + 40) // fair_share.CHARS_PER_TOKEN
    async with app.state.session_factory() as session:
        message = await session.get(DbMessage, message_id)
        assert message is not None
        recomputed = await fair_share.new_ticket(session, app.state.settings, message)
    assert recomputed.prompt_tokens == ticket["prompt_tokens"]
    await client.post(f"/chats/{conv.chat_id}/messages/{message_id}/cancel", headers=user.headers)
