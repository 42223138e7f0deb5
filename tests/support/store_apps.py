"""An app of a test module's own, on each store: Postgres with Redis (a fresh database and key prefix) and
SQLite with the in-process broker; and the helpers of the tests of API keys' limits on it.

A module binds the fixtures (``store, app, client, user, model = store_apps.FIXTURES``, at the end here)
and defines ``app_settings``, a module-scoped fixture of its settings over the session's (``settings``,
in inference/server/tests/conftest.py); the apps are module-scoped, so each module has its own two."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings
from tests.support.api import ADMIN, User, register_live_model, sign_in
from tests.support.services import fresh_database


@pytest.fixture(scope="module", params=["postgres+redis", "sqlite+memory"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, api_redis_prefix: str
) -> Iterator[dict[str, Any]]:
    """The settings of the module's database and broker, named after the module."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    if request.param == "sqlite+memory":
        database = tmp_path_factory.mktemp(name) / "oasst.db"
        yield {"database_url": f"sqlite+aiosqlite:///{database}", "broker_url": None}
        return
    with fresh_database(f"oasst_{name}") as url:
        yield {"database_url": url, "redis_key_prefix": f"{api_redis_prefix}{name}{uuid.uuid4().hex[:6]}:"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def app(
    store: dict[str, Any], app_settings: dict[str, Any], settings: Settings
) -> AsyncIterator[FastAPI]:
    application = create_app(settings.model_copy(update={**store, "max_queue_size": 1000, **app_settings}))
    async with LifespanManager(application, startup_timeout=60, shutdown_timeout=30):
        yield application


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as http:
        yield http


@pytest_asyncio.fixture(loop_scope="session")
async def user(client: httpx.AsyncClient) -> User:
    return await sign_in(client)


@pytest_asyncio.fixture(loop_scope="session")
async def model(app: FastAPI) -> str:
    return await register_live_model(app)


async def new_key(client: httpx.AsyncClient, user: User, name: str = "limited") -> tuple[str, dict[str, str]]:
    """A new API key of ``user``: its id and the headers that use it."""
    created = await client.post("/api_keys", json={"name": name}, headers=user.headers)
    assert created.status_code in (200, 201), created.text
    body = created.json()
    return body["id"], {"Authorization": f"Bearer {body['key']}"}


async def put_limits(client: httpx.AsyncClient, path: str, **limits: Any) -> dict[str, Any]:
    """The admin API sets the limits of ``path`` (``keys/<id>`` or ``users/<id>``); its answer."""
    response = await client.put(f"/admin/{path}/limits", json=limits, headers=ADMIN)
    assert response.status_code == 200, response.text
    return dict(response.json())


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The /v1 error (OpenAI's shape) of a refused request, asserted to have ``status`` and ``code``."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return dict(error)


# What a module binds to find the fixtures: ``store, app, client, user, model = store_apps.FIXTURES``.
FIXTURES = (store, app, client, user, model)
