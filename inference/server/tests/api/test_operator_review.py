"""Issue 28's operator features under attack (review28): garbage to the new admin routes never 500s;
the key limits hold on the routes that bypassed them; moderation sees every text a caller writes.

The app of ``test_key_limits`` (Postgres with Redis, and SQLite with the in-process broker)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager

from oasst_inference_server.main import create_app
from tests.support.api import ADMIN, API, User, register_live_model, sign_in
from tests.support.services import fresh_database

pytestmark = API


@pytest.fixture(scope="module", params=["postgres+redis", "sqlite+memory"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory, api_redis_prefix: str
) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite+memory":
        database = tmp_path_factory.mktemp("review28") / "oasst.db"
        yield {"database_url": f"sqlite+aiosqlite:///{database}", "broker_url": None}
        return
    with fresh_database("oasst_review28") as url:
        yield {"database_url": url, "redis_key_prefix": f"{api_redis_prefix}r28{uuid.uuid4().hex[:6]}:"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def app(store: dict[str, Any], settings) -> AsyncIterator[Any]:
    application = create_app(
        settings.model_copy(update={**store, "max_queue_size": 1000, "database_pool_size": 3})
    )
    async with LifespanManager(application, startup_timeout=60, shutdown_timeout=30):
        yield application


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as http:
        yield http


@pytest_asyncio.fixture(loop_scope="session")
async def user(client) -> User:
    return await sign_in(client)


@pytest_asyncio.fixture(loop_scope="session")
async def model(app) -> str:
    return await register_live_model(app)


async def new_key(client, user: User) -> tuple[str, dict[str, str]]:
    created = await client.post("/api_keys", json={"name": "review"}, headers=user.headers)
    assert created.status_code in (200, 201), created.text
    body = created.json()
    return body["id"], {"Authorization": f"Bearer {body['key']}"}


async def put_limits(client, path: str, **limits: Any) -> dict[str, Any]:
    response = await client.put(f"/admin/{path}/limits", json=limits, headers=ADMIN)
    assert response.status_code == 200, response.text
    return dict(response.json())


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return dict(error)


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
