"""Issue 28's operator features under attack (review28): garbage to the new admin routes never 500s;
the key limits hold on the routes that bypassed them; moderation sees every text a caller writes.

Apps of their own as ``test_key_limits``' (``tests.support.store_apps``: Postgres with Redis, and SQLite with
the in-process broker)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import pytest_asyncio
from sqlmodel import func, select

from oasst_inference_server.broker import WorkerSession
from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.settings_sections.moderation import ClassifierCategory
from oasst_shared.model_configs import MINILM_EMBEDDING, SMOLLM2_135M, ModelConfig
from oasst_shared.protocol import GeneratedText, WorkerCapabilities
from oasst_shared.schemas import MessageState
from tests.support import store_apps
from tests.support.api import ADMIN, API, sign_in
from tests.support.store_apps import new_key, put_limits, refused

pytestmark = API

store, app, client, user, model = store_apps.FIXTURES  # the module's own two apps

BANNED = "forbiddenword"
# The word list refuses BANNED; the classifier (an embedding model whose worker never answers, so each
# classification times out and lets the text through) stands for a classifier's cost per request.
MODERATION: dict[str, Any] = {
    "database_pool_size": 3,
    "moderation_enabled": True,
    "moderation_word_lists": {"banned": [BANNED]},
    "moderation_classifier_model": MINILM_EMBEDDING.name,
    "moderation_classifier_categories": {
        "harm": ClassifierCategory(examples=["how to hurt people"], threshold=0.99)
    },
    "moderation_classifier_timeout": 0.5,
}


@pytest.fixture(scope="module")
def app_settings() -> dict[str, Any]:
    return MODERATION


@pytest.mark.parametrize(
    ("method", "path", "body", "params"),
    [
        ("PUT", "/admin/keys/{key}/limits", b'{"budget_usd": NaN, "budget_period": "day"}', None),
        ("PUT", "/admin/keys/{key}/limits", b'{"budget_usd": Infinity, "budget_period": "day"}', None),
        ("PUT", "/admin/keys/{key}/limits", {"budget_usd": -1, "budget_period": "day"}, None),
        ("PUT", "/admin/keys/{key}/limits", {"requests_per_minute": 10**30}, None),
        ("PUT", "/admin/keys/{key}/limits", {"requests_per_minute": 1.5}, None),
        ("PUT", "/admin/keys/{key}/limits", {"allowed_models": "x"}, None),
        ("PUT", "/admin/keys/{key}/limits", {"allowed_models": [1, None]}, None),
        ("PUT", "/admin/keys/{key}/limits", ["not", "an", "object"], None),
        ("PUT", "/admin/keys/{key}/limits", {"allowed_models": ["é" * 200]}, None),
        ("PUT", "/admin/keys/" + "k" * 5000 + "/limits", {}, None),
        ("PUT", "/admin/users/{user}/limits", {"tokens_per_minute": -5}, None),
        ("GET", "/admin/usage", None, {"until": "0001-01-01T00:00:00"}),
        ("GET", "/admin/usage", None, {"since": "9999-12-31T23:59:59", "until": "9999-12-31T23:59:59"}),
        ("GET", "/admin/usage", None, {"since": "0001-01-01T00:00:00+14:00"}),
        ("GET", "/admin/usage", None, {"since": "2020-01-01T00:00:00+01:00", "until": "2020-01-02"}),
        ("GET", "/admin/usage", None, {"model": "m" * 10_000}),
        ("GET", "/admin/usage", None, {"since": "nonsense"}),
        ("GET", "/admin/keys", None, {"limit": -1}),
        ("GET", "/admin/keys", None, {"limit": "NaN"}),
        ("PUT", "/admin/aliases/" + "a" * 5000, {"model": "x"}, None),
        ("PUT", "/admin/aliases/ünïcode", {"model": "x"}, None),
        ("PUT", "/admin/aliases/ok-alias", {"model": "x" * 100_000}, None),
        ("PUT", "/admin/aliases/ok-alias", {"model": "x", "fallbacks": ["y" * 100_000]}, None),
        ("PUT", "/admin/aliases/ok-alias", {"model": "x", "fallbacks": "y"}, None),
        ("PUT", "/admin/aliases/ok-alias", {"model": 5}, None),
        ("DELETE", "/admin/aliases/" + "a" * 5000, None, None),
        ("GET", "/admin/moderation/flags", None, {"limit": 10**9}),
        ("GET", "/admin/moderation/flags", None, {"before": "0001-01-01T00:00:00+14:00"}),
        ("GET", "/admin/export", None, {"since": "2020-01-01T00:00:00+01:00", "until": "2020-01-01"}),
        ("GET", "/admin/export", None, {"since": "0001-01-01T00:00:00+14:00"}),
        ("GET", "/admin/export", None, {"user_id": "u" * 5000}),
        ("PUT", "/admin/users/{user}/admin", {"admin": "yes please"}, None),
        ("PUT", "/admin/users/" + "u" * 5000 + "/admin", {"admin": True}, None),
    ],
)
async def test_garbage_to_the_admin_routes_is_a_4xx(client, user, method, path, body, params) -> None:
    key_id, _ = await new_key(client, user)
    url = path.format(key=key_id, user=user.id)
    if isinstance(body, bytes):
        sent: dict[str, Any] = {"content": body, "headers": {**ADMIN, "Content-Type": "application/json"}}
    else:
        sent = {"json": body, "headers": ADMIN}
    response = await client.request(method, url, params=params, **sent)
    assert response.status_code < 500, response.text
    if method == "GET" and response.status_code == 200:
        return  # odd but valid (a window with a zone against one without): answered
    assert 400 <= response.status_code < 500, response.text
    assert "Traceback" not in response.text


async def live_worker(app, config: ModelConfig, **capabilities: bool) -> str:
    """A worker session of ``config`` that never takes work (with these capabilities); its model's name."""
    session = WorkerSession(
        model_config=config,
        max_parallel_requests=1,
        free_slots=0,
        backend_kind="fake",
        worker_version="test",
        connected_at=0.0,
        capabilities=WorkerCapabilities(**capabilities),
    )
    await app.state.broker.put_worker_session(session.record(f"ws-{uuid.uuid4().hex[:8]}"), ttl=3600)
    return config.name


async def embedder(app) -> None:
    """The classifier's embedding model, served by a worker that never answers."""
    await live_worker(app, MINILM_EMBEDDING)


@pytest_asyncio.fixture(loop_scope="session")
async def tool_model(app) -> str:
    config = SMOLLM2_135M.model_copy(update={"name": f"tool-model-{uuid.uuid4().hex[:6]}"})
    return await live_worker(app, config, tools=True, tokenize=True)


async def embedding_jobs(app, user_id: str) -> int:
    async with app.state.session_factory() as session:
        query = select(func.count()).where(
            DbMessage.user_id == user_id, DbMessage.kind == MessageKind.embedding
        )
        return int((await session.exec(query)).one())


def chat_body(model: str, *messages: dict[str, Any], system: str | None = None) -> dict[str, Any]:
    turns = ([{"role": "system", "content": system}] if system else []) + list(messages)
    return {"model": model, "messages": turns, "max_tokens": 4}


# ------------------------------------------------------------------------ moderation


async def test_moderation_reads_every_turn_an_api_caller_writes(client, user, tool_model) -> None:
    """A listed word in a tool result or an assistant turn the caller sends reaches the model as much as
    one in a user turn: refused alike."""
    ask = {"role": "user", "content": "What did the tool say?"}
    call = {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    for messages in (
        [
            ask,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": f"say {BANNED}"},
        ],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": f"I said {BANNED}"}, ask],
    ):
        response = await client.post(
            "/v1/chat/completions", json=chat_body(tool_model, *messages), headers=user.headers
        )
        refused(response, 400, "content_policy_violation")
    system = await client.post(
        "/v1/chat/completions",
        json=chat_body(tool_model, ask, system=f"Always say {BANNED}"),
        headers=user.headers,
    )
    refused(system, 400, "content_policy_violation")


async def test_moderation_reads_the_chat_api_s_system_prompt(client, user, model) -> None:
    chat = await client.post("/chats", json={}, headers=user.headers)
    body = {"content": "Hello", "model_config_name": model, "system_prompt": f"Always say {BANNED}."}
    response = await client.post(f"/chats/{chat.json()['id']}/turns", json=body, headers=user.headers)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "content_policy_violation"
    prompt = await client.post(
        f"/chats/{chat.json()['id']}/prompter_message", json={"content": "Hello"}, headers=user.headers
    )
    answer = await client.post(
        f"/chats/{chat.json()['id']}/assistant_message",
        json={
            "parent_id": prompt.json()["id"],
            "model_config_name": model,
            "system_prompt": f"Say {BANNED}.",
        },
        headers=user.headers,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "content_policy_violation"


async def test_a_request_its_limits_refuse_costs_no_classifier_job(client, app, model) -> None:
    """The classifier's embedding job ran before admission: a key past its limits (or asking for a model
    it may not use) still had the fleet embed its every request."""
    await embedder(app)
    user = await sign_in(client)
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", allowed_models=["some-other-model"])
    ask = {"role": "user", "content": "Hello"}
    for _ in range(3):
        response = await client.post("/v1/chat/completions", json=chat_body(model, ask), headers=headers)
        refused(response, 403, "model_not_allowed")
        completion = await client.post(
            "/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 4}, headers=headers
        )
        refused(completion, 403, "model_not_allowed")
    assert await embedding_jobs(app, user.id) == 0
    # The chat API: the user's own limits.
    await put_limits(client, f"users/{user.id}", allowed_models=["some-other-model"])
    chat = await client.post("/chats", json={}, headers=user.headers)
    turn = await client.post(
        f"/chats/{chat.json()['id']}/turns",
        json={"content": "Hello", "model_config_name": model},
        headers=user.headers,
    )
    assert turn.status_code == 403, turn.text
    assert await embedding_jobs(app, user.id) == 0


# ------------------------------------------------------------------------ key limits on every route


async def test_tokenizing_keeps_to_the_key_s_allow_list_and_requests_per_minute(
    client, user, model, tool_model
) -> None:
    """/tokenize, /detokenize and Anthropic's count_tokens put a worker to work like any request: a key
    may not use them on a model it may not use, and they count against its requests per minute."""
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", allowed_models=["some-other-model"])
    tokenize = await client.post("/tokenize", json={"model": tool_model, "prompt": "Hi"}, headers=headers)
    refused(tokenize, 403, "model_not_allowed")
    detokenize = await client.post(
        "/detokenize", json={"model": tool_model, "tokens": [1, 2]}, headers=headers
    )
    refused(detokenize, 403, "model_not_allowed")
    counted = await client.post(
        "/v1/messages/count_tokens",
        json={"model": tool_model, "messages": [{"role": "user", "content": "Hi"}]},
        headers=headers,
    )
    assert counted.status_code == 403, counted.text
    assert counted.json()["error"]["type"] == "permission_error"
    # Requests per minute: the first is let in (its model's workers cannot tokenize: a 400), the
    # second is over the limit.
    await put_limits(client, f"keys/{key_id}", requests_per_minute=1)
    first = await client.post("/tokenize", json={"model": model, "prompt": "Hi"}, headers=headers)
    refused(first, 400, "tokenize_unsupported")
    second = await client.post("/tokenize", json={"model": model, "prompt": "Hi"}, headers=headers)
    refused(second, 429, "key_requests_per_minute")
    assert int(second.headers["Retry-After"]) >= 1


async def pending_of(app, key_id: str) -> list[str]:
    async with app.state.session_factory() as session:
        query = select(DbMessage.id).where(
            DbMessage.api_key_id == key_id, DbMessage.state == MessageState.pending
        )
        return list((await session.exec(query)).all())


async def test_an_answer_moderation_cut_still_charges_its_prompt(client, app, user, model) -> None:
    """An answer moderation cuts mid-stream is stored at once, before its worker reports the prompt's
    tokens; the worker's late report is charged (the prompt was free: a long prompt whose answer starts
    with a listed word cost a key's budget a few tokens)."""
    key_id, headers = await new_key(client, user)
    await put_limits(client, f"keys/{key_id}", budget_tokens=40, budget_period="day")
    task = asyncio.create_task(
        client.post(
            "/v1/chat/completions", json=chat_body(model, {"role": "user", "content": "Hi"}), headers=headers
        )
    )
    for _ in range(500):
        if ids := await pending_of(app, key_id):
            break
        await asyncio.sleep(0.02)
    (message_id,) = ids
    session_id = f"ws-cut-{uuid.uuid4().hex[:8]}"
    lifecycle = app.state.lifecycle
    assert await lifecycle.claim(message_id, session_id) is not None
    # What the cut stores (workers.answer_moderation): the tokens relayed, no prompt tokens yet.
    cut = GeneratedText.model_construct(
        message_id=message_id,
        text="",
        finish_reason="content_filter",
        generated_tokens=3,
        prompt_tokens=None,
        tool_calls=None,
        prefix_tokens=None,
        cached_tokens=None,
    )
    assert await lifecycle.complete(session_id, cut)
    await task
    # The worker's own end, later: its prompt counts, once.
    assert await lifecycle.late_prompt_tokens(message_id, 50)
    assert not await lifecycle.late_prompt_tokens(message_id, 50)
    over = client.post(
        "/v1/chat/completions", json=chat_body(model, {"role": "user", "content": "Hi"}), headers=headers
    )
    refused(await asyncio.wait_for(over, 30), 429, "key_budget_exceeded")  # 53 of 40


async def test_an_alias_or_a_fallback_never_serves_a_model_the_key_may_not_use(
    client, app, user, model
) -> None:
    """A key allowed one model asks for an alias of another, or for its own model whose fallback is
    another: refused (403), nothing queued."""
    key_id, headers = await new_key(client, user)
    allowed = SMOLLM2_135M.name  # a config of the server's files that no worker serves here
    await put_limits(client, f"keys/{key_id}", allowed_models=[allowed])
    alias, fallback = f"r28-{uuid.uuid4().hex[:6]}", f"r28fb-{uuid.uuid4().hex[:6]}"
    for name, route in ((alias, {"model": model}), (fallback, {"model": allowed, "fallbacks": [model]})):
        response = await client.put(f"/admin/aliases/{name}", json=route, headers=ADMIN)
        assert response.status_code == 200, response.text
    for name in (alias, fallback):
        response = await client.post(
            "/v1/chat/completions", json=chat_body(name, {"role": "user", "content": "Hi"}), headers=headers
        )
        refused(response, 403, "model_not_allowed")
    assert await pending_of(app, key_id) == []
    listed = {m["id"] for m in (await client.get("/v1/models", headers=headers)).json()["data"]}
    assert alias not in listed and model not in listed
