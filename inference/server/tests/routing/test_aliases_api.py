"""Model aliases and fallbacks through the API, on Postgres and Redis, with a second replica (a second app
on the same database and key prefix): a change made on one replica acts on the other at once; a request
for a model with no worker, or with a full queue, is served by its fallback, and the message carries the
model that serves it; bad aliases are clear 4xx errors."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings
from oasst_shared.model_configs import SMOLLM2_135M_Q8
from oasst_shared.model_routes import MAX_FALLBACKS
from tests.support.api import ADMIN, API, MAX_QUEUE_SIZE, User, assert_error, register_live_model, start_chat

pytestmark = API

NO_WORKER = SMOLLM2_135M_Q8.name  # a known config no worker serves here


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def replica_b(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A second replica: its own app (own alias view) on the same database and Redis prefix."""
    other: FastAPI = create_app(settings)
    async with LifespanManager(other, startup_timeout=60, shutdown_timeout=30):
        transport = httpx.ASGITransport(app=other)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield http


def alias_name() -> str:
    return f"chat-{uuid.uuid4().hex[:8]}"


async def put_alias(
    client: httpx.AsyncClient, alias: str, model: str, fallbacks: list[str] | None = None
) -> None:
    response = await client.put(
        f"/admin/aliases/{alias}", json={"model": model, "fallbacks": fallbacks or []}, headers=ADMIN
    )
    assert response.status_code == 200, response.text


async def answered_by(client: httpx.AsyncClient, user: User, model: str) -> str:
    """The model config of a new chat answer that asks for ``model`` (the answer stays pending)."""
    chat = await start_chat(client, user)
    response = await client.post(
        f"/chats/{chat.chat_id}/assistant_message",
        json={"parent_id": chat.prompter_id, "model_config_name": model},
        headers=user.headers,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["model_config_name"])


async def test_an_alias_set_on_one_replica_acts_on_the_other_at_once(app, client, replica_b, login):
    first, second = await register_live_model(app), await register_live_model(app)
    alias = alias_name()
    user = await login()

    await put_alias(client, alias, first)
    assert await answered_by(replica_b, user, alias) == first
    assert await answered_by(client, user, alias) == first

    # Switched through replica B: replica A (which has read the alias before) follows at once.
    await put_alias(replica_b, alias, second)
    assert await answered_by(client, user, alias) == second
    assert await answered_by(replica_b, user, alias) == second

    # Both replicas list it, with the model it stands for.
    for http in (client, replica_b):
        cards = {c["id"]: c for c in (await http.get("/v1/models", headers=user.headers)).json()["data"]}
        assert cards[alias]["alias_of"] == second and cards[second]["alias_of"] is None
        card = await http.get(f"/v1/models/{alias}", headers=user.headers)
        assert card.status_code == 200 and card.json()["alias_of"] == second

    # Removed on A: unknown on B at once.
    deleted = await client.delete(f"/admin/aliases/{alias}", headers=ADMIN)
    assert deleted.status_code == 204, deleted.text
    chat = await start_chat(replica_b, user)
    gone = await replica_b.post(
        f"/chats/{chat.chat_id}/assistant_message",
        json={"parent_id": chat.prompter_id, "model_config_name": alias},
        headers=user.headers,
    )
    assert_error(gone, 400, "unknown_model")
    assert alias not in {
        c["id"] for c in (await client.get("/v1/models", headers=user.headers)).json()["data"]
    }


async def test_a_model_with_no_worker_falls_back_in_order(app, client, replica_b, login):
    live = await register_live_model(app)
    alias = alias_name()
    user = await login()
    await put_alias(client, alias, NO_WORKER, [live])
    assert await answered_by(replica_b, user, alias) == live

    # Without the fallback the alias's model has no worker: a 503 that names the alias, not a fallback.
    await put_alias(client, alias, NO_WORKER)
    chat = await start_chat(replica_b, user)
    refused = await replica_b.post(
        f"/chats/{chat.chat_id}/assistant_message",
        json={"parent_id": chat.prompter_id, "model_config_name": alias},
        headers=user.headers,
    )
    body = assert_error(refused, 503, "no_worker")
    assert NO_WORKER in body["detail"] and alias in body["detail"]
    v1 = await replica_b.post(
        "/v1/chat/completions",
        json={"model": alias, "messages": [{"role": "user", "content": "Hi"}]},
        headers=user.headers,
    )
    assert v1.status_code == 503, v1.text
    assert v1.json()["error"]["code"] == "model_unavailable" and alias in v1.json()["error"]["message"]


async def test_a_full_queue_hands_new_requests_to_the_next_fallback(app, client, login):
    busy, spare = await register_live_model(app), await register_live_model(app)
    alias = alias_name()
    await put_alias(client, alias, busy, [spare])
    for _ in range(MAX_QUEUE_SIZE):  # the bound defaults to max_queue_size
        assert await answered_by(client, await login(), alias) == busy
    assert await answered_by(client, await login(), alias) == spare


async def test_user_errors_do_not_fall_back(app, client, login):
    live = await register_live_model(app)
    alias = alias_name()
    user = await login()
    await put_alias(client, alias, live, [NO_WORKER])
    # An embedding request for a generation model is the caller's error, whatever the fallbacks.
    wrong = await client.post("/v1/embeddings", json={"model": alias, "input": "hi"}, headers=user.headers)
    assert wrong.status_code == 400, wrong.text
    assert wrong.json()["error"]["code"] == "wrong_model_kind"


@pytest.mark.parametrize(
    ("alias", "body", "status", "code"),
    [
        ("bad name!", {"model": NO_WORKER}, 400, "invalid_alias_name"),
        ("x" * 65, {"model": NO_WORKER}, 400, "invalid_alias_name"),
        ("-starts-with-dash", {"model": NO_WORKER}, 400, "invalid_alias_name"),
        (NO_WORKER, {"model": "SmolLM2-135M-Instruct"}, 409, "alias_is_model"),
        ("ok-alias", {"model": "no-such-model"}, 404, "model_not_found"),
        ("ok-alias", {"model": NO_WORKER, "fallbacks": [NO_WORKER]}, 400, "invalid_fallbacks"),
        (
            "ok-alias",
            {"model": NO_WORKER, "fallbacks": ["SmolLM2-135M-Instruct"] * 2},
            400,
            "invalid_fallbacks",
        ),
        ("ok-alias", {"model": NO_WORKER, "fallbacks": ["no-such-model"]}, 400, "invalid_fallbacks"),
        ("ok-alias", {"model": NO_WORKER, "fallbacks": ["all-MiniLM-L6-v2"]}, 400, "invalid_fallbacks"),
        ("ok-alias", {"model": NO_WORKER, "fallbacks": ["a"] * (MAX_FALLBACKS + 1)}, 422, None),
        ("ok-alias", {"model": ""}, 422, None),
        ("ok-alias", {"model": NO_WORKER, "extra": 1}, 422, None),
    ],
)
async def test_bad_aliases_are_refused(client, alias, body, status, code):
    response = await client.put(f"/admin/aliases/{alias}", json=body, headers=ADMIN)
    assert_error(response, status, code)


async def test_an_alias_cannot_name_another_alias(client):
    first, second = alias_name(), alias_name()
    await put_alias(client, first, NO_WORKER)
    assert_error(
        await client.put(f"/admin/aliases/{second}", json={"model": first}, headers=ADMIN), 400, "alias_chain"
    )
    refused = await client.put(
        f"/admin/aliases/{second}", json={"model": NO_WORKER, "fallbacks": [first]}, headers=ADMIN
    )
    assert_error(refused, 400, "invalid_fallbacks")
    listed = (await client.get("/admin/aliases", headers=ADMIN)).json()["aliases"]
    assert [a for a in listed if a["alias"] in (first, second)] == [
        {
            "alias": first,
            "model": NO_WORKER,
            "fallbacks": [],
            "source": "api",
            "replaces_file": None,
            "updated_at": listed[[a["alias"] for a in listed].index(first)]["updated_at"],
        }
    ]


async def test_the_alias_admin_needs_the_admin_token(client, user):
    assert (await client.get("/admin/aliases")).status_code == 401
    assert (await client.get("/admin/aliases", headers=user.headers)).status_code == 403
    assert_error(await client.delete(f"/admin/aliases/{alias_name()}", headers=ADMIN), 404, "alias_not_found")


async def test_the_number_of_aliases_is_bounded_and_replacing_one_does_not_count(client, monkeypatch):
    listed = (await client.get("/admin/aliases", headers=ADMIN)).json()["aliases"]
    stored = sum(1 for a in listed if a["source"] == "api")
    monkeypatch.setattr("oasst_inference_server.routing.alias_admin.MAX_ALIASES", stored + 1)
    last = alias_name()
    await put_alias(client, last, NO_WORKER)
    refused = await client.put(f"/admin/aliases/{alias_name()}", json={"model": NO_WORKER}, headers=ADMIN)
    assert_error(refused, 409, "too_many_aliases")
    await put_alias(client, last, NO_WORKER)  # replaced: still one alias
