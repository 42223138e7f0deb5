"""Usage limits of API keys and users, on Postgres with Redis and on SQLite with the in-process broker:
the admin API sets them; requests per minute refuse at admission; tokens per minute and budgets are
charged from the usage reports of finished generations (reported here as a worker would: claim, then
``complete`` with the token counts) and stop the next request; allow-lists refuse (403) and hide models.

The model's worker session never takes work: every admitted generation stays pending until the test
answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml
from sqlmodel import select

from oasst_inference_server.db.models import DbMessage
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import GeneratedText
from oasst_shared.schemas import MessageState
from tests.support import store_apps
from tests.support.api import ADMIN, API, sign_in, start_chat
from tests.support.sessions import session_record
from tests.support.sql_statements import recorded_statements
from tests.support.store_apps import new_key, put_limits, refused

pytestmark = API

store, app, client, user, model = store_apps.FIXTURES  # the module's own two apps

PRICED = "priced-model"  # $2 per 1M prompt tokens, $10 per 1M completion tokens


@pytest.fixture(scope="module")
def app_settings(tmp_path_factory) -> dict[str, Any]:
    configs = tmp_path_factory.mktemp("configs")
    priced = SMOLLM2_135M.model_dump(mode="json", exclude_unset=True) | {
        "name": PRICED,
        "price_per_million_prompt_tokens": 2.0,
        "price_per_million_completion_tokens": 10.0,
    }
    (configs / "priced.yaml").write_text(yaml.safe_dump(priced))
    return {"model_configs_dir": configs}


@pytest_asyncio.fixture(loop_scope="session")
async def priced(app) -> str:
    await app.state.broker.put_worker_session(session_record(f"ws-{uuid.uuid4().hex[:8]}", PRICED), ttl=3600)
    return PRICED


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def pending_ids(app) -> list[str]:
    async with app.state.session_factory() as session:
        rows = await session.exec(select(DbMessage.id).where(DbMessage.state == MessageState.pending))
        return list(rows.all())


async def report(app, message_id: str, prompt: int, completion: int) -> None:
    """What a worker does: claim the message, then report it finished with its token counts."""
    session_id = f"ws-report-{uuid.uuid4().hex[:8]}"
    assert await app.state.lifecycle.claim(message_id, session_id) is not None
    result = GeneratedText(
        message_id=message_id,
        text="ok",
        finish_reason="length",
        generated_tokens=completion,
        prompt_tokens=prompt,
    )
    assert await app.state.lifecycle.complete(session_id, result)


async def generate(
    client, app, headers: dict[str, str], body: dict[str, Any], prompt: int, completion: int
) -> None:
    """A /v1 request admitted, answered with the given usage, and its answer read."""
    before = set(await pending_ids(app))
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))
    new: list[str] = []
    for _ in range(500):
        if task.done():
            pytest.fail(f"answered before it ran: {task.result().status_code} {task.result().text}")
        new = [m for m in await pending_ids(app) if m not in before]
        if new:
            break
        await asyncio.sleep(0.02)
    assert len(new) == 1
    await report(app, new[0], prompt, completion)
    response = await task
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["total_tokens"] == prompt + completion


@contextlib.asynccontextmanager
async def held(client, headers, body) -> AsyncIterator[asyncio.Task[httpx.Response]]:
    """A request left waiting for its answer (cancelled at the end)."""
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=headers))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


# ------------------------------------------------------------------------ the admin API


async def test_limits_are_set_listed_and_validated(client, user) -> None:
    key_id, _ = await new_key(client, user)
    listed = (await client.get("/admin/keys", params={"user_id": user.id}, headers=ADMIN)).json()
    assert [k["id"] for k in listed] == [key_id]
    assert listed[0]["limits"] == {
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "budget_tokens": None,
        "budget_usd": None,
        "budget_period": None,
        "allowed_models": None,
    }
    assert listed[0]["usage"] == {"requests_today": 0, "tokens_today": 0, "spent_usd_period": 0.0}
    assert set(listed[0]) == {"id", "user_id", "name", "prefix", "revoked_at", "limits", "usage"}
    set_ = await put_limits(
        client, f"keys/{key_id}", requests_per_minute=5, budget_usd=1.5, budget_period="day"
    )
    assert set_["limits"]["requests_per_minute"] == 5 and set_["limits"]["budget_usd"] == 1.5
    again = (await client.get("/admin/keys", params={"user_id": user.id}, headers=ADMIN)).json()
    assert again[0]["limits"] == set_["limits"]
    for bad in (
        {"requests_per_minute": 0},
        {"budget_tokens": 10},  # no period
        {"budget_period": "week", "budget_tokens": 10},
        {"limits": {"requests_per_minute": 1}},  # the body is the limits object itself
        {"allowed_models": ["x" * 129]},
    ):
        response = await client.put(f"/admin/keys/{key_id}/limits", json=bad, headers=ADMIN)
        assert response.status_code == 422, (bad, response.text)
    assert (await client.put("/admin/keys/nope/limits", json={}, headers=ADMIN)).status_code == 404
    assert (await client.put("/admin/users/nope/limits", json={}, headers=ADMIN)).status_code == 404
    assert (await client.get("/admin/keys", headers=user.headers)).status_code in (401, 403)
    # Clearing: every field null.
    cleared = await put_limits(client, f"keys/{key_id}")
    assert cleared["limits"]["requests_per_minute"] is None


# ------------------------------------------------------------------------ requests per minute


async def test_a_key_s_requests_per_minute_refuse_with_its_name_and_retry_after(
    client, app, user, model
) -> None:
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", requests_per_minute=2)
    async with held(client, headers, chat(model)), held(client, headers, chat(model)):
        for _ in range(500):
            if len(await pending_ids(app)) >= 2:
                break
            await asyncio.sleep(0.02)
        over = await client.post("/v1/chat/completions", json=chat(model), headers=headers)
        error = refused(over, 429, "key_requests_per_minute")
        assert error["type"] == "rate_limit_error"
        assert 1 <= int(over.headers["Retry-After"]) <= 60
        # The Anthropic route refuses in its own shape, naming the limit.
        anthropic = await client.post(
            "/v1/messages",
            json={"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
            headers={
                "x-api-key": headers["Authorization"].removeprefix("Bearer "),
                "anthropic-version": "2023-06-01",
            },
        )
        assert anthropic.status_code == 429, anthropic.text
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "rate_limit_error"
        assert "key_requests_per_minute" in anthropic.json()["error"]["message"]
        assert "Retry-After" in anthropic.headers
        # The user's other means (a token) are not the key's: they pass.
        async with held(client, user.headers, chat(model)):
            pass
    for message_id in await pending_ids(app):
        await report(app, message_id, 1, 1)


async def test_a_user_s_limit_counts_the_chat_api_too(client, app, model) -> None:
    user = await sign_in(client)
    await put_limits(client, f"users/{user.id}", requests_per_minute=1)
    await start_chat(client, user, model=model)
    conversation = await start_chat(client, user)  # a prompt, no answer yet
    response = await client.post(
        f"/chats/{conversation.chat_id}/assistant_message",
        json={"parent_id": conversation.prompter_id, "model_config_name": model},
        headers=user.headers,
    )
    assert response.status_code == 429, response.text
    assert response.json()["code"] == "user_requests_per_minute"
    assert int(response.headers["Retry-After"]) >= 1
    for message_id in await pending_ids(app):
        await report(app, message_id, 1, 1)


# ------------------------------------------------------------------------ tokens and budgets


async def test_a_token_budget_stops_the_key_once_the_reports_reach_it(client, app, user, model) -> None:
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", budget_tokens=100, budget_period="day")
    await generate(client, app, headers, chat(model), prompt=30, completion=20)  # 50 of 100
    await generate(
        client, app, headers, chat(model), prompt=30, completion=19
    )  # 99 of 100: one more may start
    await generate(client, app, headers, chat(model), prompt=1, completion=1)  # 101
    over = await client.post("/v1/chat/completions", json=chat(model), headers=headers)
    error = refused(over, 429, "key_budget_exceeded")
    assert "101 of its 100 tokens" in error["message"]
    assert int(over.headers["Retry-After"]) <= 24 * 3600
    listed = (await client.get("/admin/keys", params={"user_id": user.id}, headers=ADMIN)).json()
    usage = next(k for k in listed if k["id"] == key_id)["usage"]
    assert usage["requests_today"] == 3 and usage["tokens_today"] == 101
    # Raising the budget lets the key in again, with what it used still counted.
    await put_limits(client, f"keys/{key_id}", budget_tokens=150, budget_period="day")
    await generate(client, app, headers, chat(model), prompt=10, completion=10)


async def test_a_request_reads_its_limits_once(client, app, user, model) -> None:
    """Admission reads the key's and the user's limits in one query, once per request (the budget's
    usage is read from the database only when its counter is missing, not per request)."""
    key_id, headers = await new_key(client, user)
    await put_limits(
        client, f"keys/{key_id}", requests_per_minute=50, budget_tokens=10_000, budget_period="day"
    )
    await put_limits(client, f"users/{user.id}", tokens_per_minute=10_000)
    await generate(client, app, headers, chat(model), prompt=5, completion=5)  # the budget's counter is built
    with recorded_statements(app) as statements:
        await generate(client, app, headers, chat(model), prompt=5, completion=5)
    assert sum("FROM usage_limit" in s for s in statements) == 1, statements
    assert not [s for s in statements if "usage_record" in s], statements  # no rebuild of the budget


async def test_a_retried_report_is_not_charged_twice(client, app, user, model) -> None:
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", budget_tokens=60, budget_period="month")
    await generate(client, app, headers, chat(model), prompt=20, completion=20)  # 40 of 60
    async with app.state.session_factory() as session:
        message = (await session.exec(select(DbMessage).where(DbMessage.api_key_id == key_id))).one()
    # The worker's report again: the generation ended once (the database), so it is not charged again.
    assert message.worker_session_id is not None
    again = GeneratedText(
        message_id=message.id, text="ok", finish_reason="length", generated_tokens=20, prompt_tokens=20
    )
    assert not await app.state.lifecycle.complete(message.worker_session_id, again)
    assert not await app.state.lifecycle.usage_charger.charge(message)  # the same generation again
    await generate(client, app, headers, chat(model), prompt=10, completion=10)  # 60: room was left


async def test_a_money_budget_charges_the_model_s_prices(client, app, user, priced) -> None:
    key_id, headers = await new_key(client, user)
    # $2/1M prompt + $10/1M completion: 100k prompt + 20k completion tokens = $0.20 + $0.20.
    await put_limits(client, f"keys/{key_id}", budget_usd=0.5, budget_period="month")
    await generate(client, app, headers, chat(priced), prompt=100_000, completion=20_000)
    await generate(client, app, headers, chat(priced), prompt=50_000, completion=0)  # $0.50
    over = await client.post("/v1/chat/completions", json=chat(priced), headers=headers)
    refused(over, 429, "key_budget_exceeded")
    usage = (await client.get("/admin/usage", params={"key_id": key_id}, headers=ADMIN)).json()
    assert len(usage) == 1
    assert usage[0]["model"] == PRICED and usage[0]["requests"] == 2
    assert (usage[0]["prompt_tokens"], usage[0]["completion_tokens"]) == (150_000, 20_000)
    assert usage[0]["cost_usd"] == pytest.approx(0.5)
    listed = (await client.get("/admin/keys", params={"user_id": user.id}, headers=ADMIN)).json()
    assert next(k for k in listed if k["id"] == key_id)["usage"]["spent_usd_period"] == pytest.approx(0.5)


async def test_tokens_per_minute_count_the_reports(client, app, user, model) -> None:
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", tokens_per_minute=50)
    await generate(client, app, headers, chat(model), prompt=25, completion=25)
    over = await client.post("/v1/chat/completions", json=chat(model), headers=headers)
    refused(over, 429, "key_tokens_per_minute")
    assert 1 <= int(over.headers["Retry-After"]) <= 60


async def test_a_lost_budget_counter_is_rebuilt_from_the_database(client, app, user, model, store) -> None:
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", budget_tokens=40, budget_period="day")
    await generate(client, app, headers, chat(model), prompt=20, completion=20)
    # The broker loses its counters (a Redis flush; a restarted embedded server).
    broker = app.state.broker
    if store.get("broker_url", "") is None:
        broker._counters.__init__()
    else:
        client_ = broker._client
        async for name in client_.scan_iter(match=broker.keys.counter("budget_tokens:*")):
            await client_.delete(name)
    over = await client.post("/v1/chat/completions", json=chat(model), headers=headers)
    refused(over, 429, "key_budget_exceeded")


# ------------------------------------------------------------------------ allow-lists


async def test_an_allow_list_refuses_and_hides_other_models(client, app, user, model, priced) -> None:
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", allowed_models=[priced])
    response = await client.post("/v1/chat/completions", json=chat(model), headers=headers)
    error = refused(response, 403, "model_not_allowed")
    assert error["param"] == "model"
    listed = {m["id"] for m in (await client.get("/v1/models", headers=headers)).json()["data"]}
    assert priced in listed and model not in listed
    assert (await client.get(f"/v1/models/{model}", headers=headers)).status_code == 404
    # The user's own token is not limited by the key's list.
    everything = {m["id"] for m in (await client.get("/v1/models", headers=user.headers)).json()["data"]}
    assert model in everything
