"""Every route against every kind of caller: a table says who may call each route of the
OpenAPI document (and the worker socket), and the test calls each with an anonymous request, another
user, a worker key, an API key, an expired token, a revoked token, an admin and the owner.

A route missing from the table fails the test: a new route needs a decision about who may call it.
Each test runs on both stores: Postgres with Redis (the session's app) and SQLite with the in-process
broker (an app of this module).
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager

from oasst_inference_server.main import create_app
from oasst_shared.protocol import API_KEY_HEADER
from tests.support.api import ADMIN, API, finish_message, register_live_model, sign_in, start_chat

pytestmark = API


# The session's fixtures of the same names, on both stores (the Postgres one is the session's app).
@pytest_asyncio.fixture(scope="module", loop_scope="session", params=["postgres+redis", "sqlite+memory"])
async def app(request, app, settings, tmp_path_factory) -> AsyncIterator[Any]:
    if request.param == "postgres+redis":
        yield app
        return
    database = tmp_path_factory.mktemp("route-table") / "oasst.db"
    sqlite = settings.model_copy(
        update={"database_url": f"sqlite+aiosqlite:///{database}", "broker_url": None}
    )
    application = create_app(sqlite)
    async with LifespanManager(application, startup_timeout=60, shutdown_timeout=30):
        yield application


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        yield http


@pytest.fixture
def login(client):
    async def sign_in_new(name: str | None = None):
        return await sign_in(client, name)

    return sign_in_new


@pytest_asyncio.fixture(loop_scope="session")
async def live_model(app) -> str:
    return await register_live_model(app)


class Access(enum.Enum):
    PUBLIC = "anyone; the answer does not depend on credentials"
    USER = "a signed-in user or one of their API keys"
    SIGNED_IN = "a signed-in user (access token or trusted client), not an API key"
    API = "an API key or an access token (the OpenAI-compatible API and usage)"
    ADMIN = "the admin root token or an admin user's access token (none of the callers here is one)"


# (method, path) -> who may call it, and whether the path names a resource of its owner (another
# user gets 404 there: not even its existence is told).
ROUTES: dict[tuple[str, str], tuple[Access, bool]] = {
    ("GET", "/health"): (Access.PUBLIC, False),
    ("GET", "/metrics"): (Access.PUBLIC, False),  # development, no metrics token (see test_edge_guard)
    ("GET", "/configs/model_configs"): (Access.PUBLIC, False),
    ("GET", "/configs/builtin_plugins"): (Access.PUBLIC, False),  # the original web page's routes
    ("POST", "/configs/plugin_config"): (Access.PUBLIC, False),
    ("GET", "/auth/providers"): (Access.PUBLIC, False),
    ("POST", "/auth/refresh"): (Access.PUBLIC, False),  # the refresh token in the body is the credential
    ("POST", "/auth/logout"): (Access.PUBLIC, False),
    ("POST", "/auth/trusted"): (Access.PUBLIC, False),  # the TrustedClient header is the credential
    ("GET", "/auth/login/debug"): (Access.PUBLIC, False),
    ("GET", "/auth/callback/debug"): (Access.PUBLIC, False),
    ("GET", "/auth/login/{provider}"): (Access.PUBLIC, False),
    ("GET", "/auth/callback/{provider}"): (Access.PUBLIC, False),
    ("GET", "/auth/check"): (Access.USER, False),
    ("GET", "/account"): (Access.SIGNED_IN, False),
    ("DELETE", "/account"): (Access.SIGNED_IN, False),
    ("GET", "/account/settings"): (Access.SIGNED_IN, False),
    ("PUT", "/account/settings"): (Access.SIGNED_IN, False),
    ("PUT", "/chats/hide_all"): (Access.USER, False),
    ("POST", "/chats/hide_all"): (Access.USER, False),
    ("POST", "/chats"): (Access.USER, False),
    ("GET", "/chats"): (Access.USER, False),
    ("GET", "/chats/{chat_id}"): (Access.USER, True),
    ("PUT", "/chats/{chat_id}"): (Access.USER, True),
    ("PATCH", "/chats/{chat_id}"): (Access.USER, True),
    ("DELETE", "/chats/{chat_id}"): (Access.USER, True),
    ("POST", "/chats/{chat_id}/prompter_message"): (Access.USER, True),
    ("POST", "/chats/{chat_id}/assistant_message"): (Access.USER, True),
    ("POST", "/chats/{chat_id}/turns"): (Access.USER, True),
    ("GET", "/chats/{chat_id}/messages/{message_id}"): (Access.USER, True),
    ("POST", "/chats/{chat_id}/messages/{message_id}/cancel"): (Access.USER, True),
    ("GET", "/chats/{chat_id}/messages/{message_id}/events"): (Access.USER, True),
    ("POST", "/chats/{chat_id}/messages/{message_id}/votes"): (Access.USER, True),
    ("POST", "/chats/{chat_id}/messages/{message_id}/reports"): (Access.USER, True),
    ("POST", "/chats/{chat_id}/messages/{message_id}/message_evals"): (Access.USER, True),
    ("GET", "/api_keys"): (Access.SIGNED_IN, False),
    ("POST", "/api_keys"): (Access.SIGNED_IN, False),
    ("DELETE", "/api_keys/{key_id}"): (Access.SIGNED_IN, True),
    ("GET", "/usage"): (Access.API, False),
    ("GET", "/usage/requests"): (Access.API, False),
    ("GET", "/usage/requests/{request_id}"): (Access.API, True),
    ("GET", "/v1/models"): (Access.API, False),
    ("GET", "/v1/models/{model}"): (Access.API, False),
    ("POST", "/v1/chat/completions"): (Access.API, False),
    ("POST", "/v1/completions"): (Access.API, False),
    ("POST", "/v1/embeddings"): (Access.API, False),
    ("POST", "/v1/moderations"): (Access.API, False),  # 404 while the moderation hook is off
    ("POST", "/v1/messages"): (Access.API, False),  # the Anthropic Messages API (x-api-key too)
    ("POST", "/v1/messages/count_tokens"): (Access.API, False),
    ("POST", "/v1/responses"): (Access.API, False),
    ("GET", "/v1/responses/{response}"): (Access.API, True),
    ("DELETE", "/v1/responses/{response}"): (Access.API, True),
    ("POST", "/v1/responses/{response}/cancel"): (Access.API, True),
    ("GET", "/v1/responses/{response}/input_items"): (Access.API, True),
    ("GET", "/v1/chat/completions/{completion_id}/stream"): (Access.API, True),  # resuming a stream
    ("GET", "/v1/completions/{completion_id}/stream"): (Access.API, True),
    ("POST", "/v1/rerank"): (Access.API, False),
    ("POST", "/v1/score"): (Access.API, False),
    ("POST", "/tokenize"): (Access.API, False),  # vLLM's paths, outside /v1
    ("POST", "/detokenize"): (Access.API, False),
    ("GET", "/admin/workers"): (Access.ADMIN, False),
    ("GET", "/admin/moderation/flags"): (Access.ADMIN, False),
    ("POST", "/admin/workers"): (Access.ADMIN, False),
    ("POST", "/admin/workers/{worker_id}/api_key"): (Access.ADMIN, False),
    ("DELETE", "/admin/workers/{worker_id}"): (Access.ADMIN, False),
    ("GET", "/admin/worker_sessions"): (Access.ADMIN, False),
    ("PUT", "/admin/workers/{worker_id}/limits"): (Access.ADMIN, False),
    ("PUT", "/admin/workers/{worker_id}/trust"): (Access.ADMIN, False),
    ("GET", "/admin/compliance_checks"): (Access.ADMIN, False),
    ("GET", "/admin/queues"): (Access.ADMIN, False),
    ("GET", "/admin/fleet"): (Access.ADMIN, False),
    ("POST", "/admin/fleet/moves"): (Access.ADMIN, False),
    ("POST", "/admin/fleet/unloads"): (Access.ADMIN, False),
    ("GET", "/admin/rebalancer"): (Access.ADMIN, False),
    ("GET", "/admin/export"): (Access.ADMIN, False),
    ("PUT", "/admin/users/{user_id}/tier"): (Access.ADMIN, False),
    ("PUT", "/admin/users/{user_id}/admin"): (Access.ADMIN, False),
    ("GET", "/admin/users/{user_id}"): (Access.ADMIN, False),
    ("POST", "/admin/users/{user_id}/revoke_tokens"): (Access.ADMIN, False),
    ("DELETE", "/admin/users/{user_id}"): (Access.ADMIN, False),
    ("GET", "/admin/keys"): (Access.ADMIN, False),
    ("PUT", "/admin/keys/{key_id}/limits"): (Access.ADMIN, False),
    ("GET", "/admin/users/{user_id}/limits"): (Access.ADMIN, False),
    ("PUT", "/admin/users/{user_id}/limits"): (Access.ADMIN, False),
    ("GET", "/admin/usage"): (Access.ADMIN, False),
    ("GET", "/admin/aliases"): (Access.ADMIN, False),
    # PUT before DELETE (routes are called in path order, stably): the admin's DELETE finds the alias.
    ("PUT", "/admin/aliases/{alias}"): (Access.ADMIN, False),
    ("DELETE", "/admin/aliases/{alias}"): (Access.ADMIN, False),
}
# Routes whose owner may get a 404 for reasons of the resource, not of access (a chat answer is not
# an API request).
OWNER_404_OK = {("GET", "/usage/requests/{request_id}")}
# The world's "response" is the id a response of its chat answer would have: not a stored response.
OWNER_404_OK |= {
    ("GET", "/v1/responses/{response}"),
    ("DELETE", "/v1/responses/{response}"),
    ("POST", "/v1/responses/{response}/cancel"),
    ("GET", "/v1/responses/{response}/input_items"),
}
# Likewise the world's "completion_id" names its chat answer, which is not an API completion.
OWNER_404_OK |= {
    ("GET", "/v1/chat/completions/{completion_id}/stream"),
    ("GET", "/v1/completions/{completion_id}/stream"),
}
# Path values that differ by route ("{...}" filled in from the world): a completion's id names its API.
PATH_VALUES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/v1/completions/{completion_id}/stream"): {"completion_id": "cmpl-{message_id}"},
    ("PUT", "/admin/aliases/{alias}"): {"alias": "route-table-alias"},
    ("DELETE", "/admin/aliases/{alias}"): {"alias": "route-table-alias"},
}
# Valid bodies where validation would otherwise answer before the ownership check; "{...}" values
# are filled in from the world.
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/chats/{chat_id}/prompter_message"): {"content": "hi", "parent_id": "{message_id}"},
    ("POST", "/chats/{chat_id}/assistant_message"): {
        "parent_id": "{prompter_id}",
        "model_config_name": "{model}",
    },
    # A model no worker serves: the turn is refused (400) after the chat was found, so it never streams.
    ("POST", "/chats/{chat_id}/turns"): {
        "parent_id": "{message_id}",
        "content": "hi",
        "model_config_name": "no-such-model",
    },
    ("POST", "/chats/{chat_id}/messages/{message_id}/votes"): {"score": 1},
    ("PUT", "/admin/users/{user_id}/tier"): {"tier": "standard"},
    ("PUT", "/admin/users/{user_id}/admin"): {"admin": False},
    ("PUT", "/admin/aliases/{alias}"): {"model": "SmolLM2-135M-Instruct"},
    ("PUT", "/admin/workers/{worker_id}/trust"): {"trusted": False},
    ("POST", "/chats/{chat_id}/messages/{message_id}/reports"): {"report_type": "spam"},
    ("POST", "/chats/{chat_id}/messages/{message_id}/message_evals"): {
        "inferior_message_ids": ["{prompter_id}"]
    },
}
CALLERS = [
    "anonymous",
    "worker_key",
    "expired_token",
    "revoked_token",
    "admin",
    "other_user",
    "api_key",
    "owner",
]


@dataclass
class World:
    """One owner's resources, and a credential of every kind."""

    values: dict[str, str]
    headers: dict[str, dict[str, str]]


async def make_world(
    client: httpx.AsyncClient, app: Any, login: Any, settings: Any, live_model: str
) -> World:
    owner, other, revoked = await login(), await login(), await login()
    conversation = await start_chat(client, owner, model=live_model)
    assert conversation.assistant_id is not None
    await finish_message(app, conversation.assistant_id)
    key = (await client.post("/api_keys", json={"name": "k"}, headers=owner.headers)).json()
    worker = (await client.post("/admin/workers", json={"name": "w"}, headers=ADMIN)).json()
    assert (await client.post(f"/admin/users/{revoked.id}/revoke_tokens", headers=ADMIN)).status_code == 200
    past = int(time.time()) - 3600
    expired = jwt.encode(
        {"sub": owner.id, "kind": "access", "gen": 0, "iat": past - 60, "exp": past},
        settings.auth_secret,
        algorithm="HS256",
    )
    bearer = lambda token: {"Authorization": f"Bearer {token}"}  # noqa: E731
    return World(
        values={
            "chat_id": conversation.chat_id,
            "message_id": conversation.assistant_id,
            "prompter_id": conversation.prompter_id,
            "key_id": key["id"],
            "request_id": conversation.assistant_id,
            "response": f"resp_{conversation.assistant_id}",
            "completion_id": f"chatcmpl-{conversation.assistant_id}",
            "worker_id": worker["id"],
            "user_id": owner.id,
            "provider": "github",
            "model": live_model,
        },
        headers={
            "anonymous": {},
            "worker_key": {API_KEY_HEADER: worker["api_key"], **bearer(worker["api_key"])},
            "expired_token": bearer(expired),
            "revoked_token": revoked.headers,
            "admin": ADMIN,
            "other_user": other.headers,
            "api_key": bearer(key["key"]),
            "owner": owner.headers,
        },
    )


def expected(access: Access, owned: bool, caller: str) -> str:
    if access is Access.PUBLIC:
        return "any"
    if access is Access.ADMIN:
        return "allowed" if caller == "admin" else "refused"
    if caller == "owner" or (caller == "api_key" and access is not Access.SIGNED_IN):
        return "allowed"
    if caller == "other_user":
        return "hidden" if owned else "allowed"
    return "refused"


def outcome(status: int) -> str:
    assert status < 500, status
    if status in (401, 403):
        return "refused"
    return "hidden" if status == 404 else "allowed"


async def call(
    client: httpx.AsyncClient, world: World, method: str, path: str, headers: dict[str, str]
) -> httpx.Response:
    body: Any = None
    if method in ("POST", "PUT", "PATCH"):
        body = {
            k: [i.format(**world.values) for i in v] if isinstance(v, list) else str(v).format(**world.values)
            for k, v in BODIES.get((method, path), {}).items()
        }
        if "score" in body:
            body["score"] = 1
    overrides = {k: v.format(**world.values) for k, v in PATH_VALUES.get((method, path), {}).items()}
    url = path.format(**{**world.values, **overrides})
    return await client.request(method, url, json=body, headers=headers, follow_redirects=False)


async def test_every_route_has_an_entry_in_the_table(client):
    schema = (await client.get("/openapi.json")).json()
    routes = {(method.upper(), path) for path, ops in schema["paths"].items() for method in ops}
    assert routes - set(ROUTES) == set(), "routes without an entry in ROUTES: decide who may call them"
    assert set(ROUTES) - routes == set(), "entries of ROUTES for routes that no longer exist"


async def test_every_route_against_every_caller(client, app, login, settings, live_model):
    problems = []
    for (method, path), (access, owned) in sorted(ROUTES.items(), key=lambda item: item[0][1]):
        world = await make_world(client, app, login, settings, live_model)
        for caller in CALLERS:
            want = expected(access, owned, caller)
            if want == "allowed" and method != "GET":
                world = await make_world(client, app, login, settings, live_model)  # may destroy it
            response = await call(client, world, method, path, world.headers[caller])
            got = outcome(response.status_code)
            if want == "allowed" and got == "hidden" and (method, path) in OWNER_404_OK:
                continue
            if want != "any" and got != want:
                problems.append(f"{method} {path} as {caller}: {response.status_code} ({got}, want {want})")
        if access is Access.PUBLIC:  # the same answer whoever asks
            statuses = set()
            for caller in CALLERS:
                statuses.add((await call(client, world, method, path, world.headers[caller])).status_code)
            if len(statuses) != 1:
                problems.append(f"{method} {path} answers differently by caller: {sorted(statuses)}")
    assert not problems, "\n".join(problems)


async def _socket_first_reply(app: Any, headers: dict[str, str]) -> str:
    """Open the worker socket as raw ASGI and return what the server does first: accept or close."""
    sent: list[dict[str, Any]] = []
    connected = False

    async def receive() -> dict[str, Any]:
        nonlocal connected
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": "/workers/work",
        "raw_path": b"/workers/work",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "subprotocols": [],
        "state": {},
    }
    await app(scope, receive, send)
    return str(sent[0]["type"]) if sent else "nothing"


async def test_the_worker_socket_takes_worker_keys_only(client, app, login, settings, live_model):
    world = await make_world(client, app, login, settings, live_model)
    for caller in CALLERS:
        headers = world.headers[caller]
        if caller != "worker_key" and "Authorization" in headers:
            # Whatever credential the caller has, also offered where a worker puts its key.
            headers = {**headers, API_KEY_HEADER: headers["Authorization"].removeprefix("Bearer ")}
        first = await _socket_first_reply(app, headers)
        want = "websocket.accept" if caller == "worker_key" else "websocket.close"
        assert first == want, (caller, first)
    assert await _socket_first_reply(app, {API_KEY_HEADER: str(uuid.uuid4())}) == "websocket.close"
