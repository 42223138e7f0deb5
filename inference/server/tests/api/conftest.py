"""Fixtures of the REST API tests: the real app (in this process, through its lifespan) on a fresh
Postgres database and a fresh Redis key prefix, a fake OAuth provider on loopback, and helpers to
sign users in.

Everything is session-scoped and runs on the session's event loop (each test module sets
``pytestmark = API``), so the app starts once.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from oasst_inference_server.broker import WorkerSession
from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings
from oasst_shared.model_configs import SMOLLM2_135M
from tests.support.api import (
    ADMIN_TOKEN,
    MAX_CHATS_PER_USER,
    MAX_MESSAGE_LENGTH,
    MAX_MESSAGES_PER_CHAT,
    MAX_QUEUE_SIZE,
    TRUSTED_CLIENT_API_KEYS,
    User,
)
from tests.support.fake_oauth import CLIENT_ID, CLIENT_SECRET, FakeProvider, ServerThread
from tests.support.processes import free_port
from tests.support.services import REDIS_URL, fresh_database


@pytest.fixture(scope="session")
def api_database_url() -> Iterator[str]:
    # Its own database: the session's production_stack would re-queue or fail these tests' pending messages.
    with fresh_database("oasst_api") as url:
        yield url


@pytest.fixture(scope="session")
def api_redis_prefix(redis_prefix: str) -> str:
    # Under the session's prefix (the root fixture deletes its keys), apart from the stacks that use it.
    return f"{redis_prefix}api:"


@pytest.fixture(scope="session")
def fake_provider() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    port = free_port()
    provider.url = f"http://127.0.0.1:{port}"
    with ServerThread(provider.app(), port):
        yield provider


@pytest.fixture(scope="session")
def settings(api_database_url: str, api_redis_prefix: str, fake_provider: FakeProvider) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=api_database_url,
        broker_url=REDIS_URL,
        redis_key_prefix=api_redis_prefix,
        allow_debug_auth=True,
        admin_root_token=ADMIN_TOKEN,
        trusted_client_api_keys=TRUSTED_CLIENT_API_KEYS,
        api_root="http://testserver",
        auth_github_client_id=CLIENT_ID,
        auth_github_client_secret=CLIENT_SECRET,
        auth_github_authorize_url=f"{fake_provider.url}/github/login/oauth/authorize",
        auth_github_token_url=f"{fake_provider.url}/github/login/oauth/access_token",
        auth_github_api_base_url=f"{fake_provider.url}/github/api/",
        auth_discord_client_id=CLIENT_ID,
        auth_discord_client_secret=CLIENT_SECRET,
        auth_discord_authorize_url=f"{fake_provider.url}/discord/api/oauth2/authorize",
        auth_discord_token_url=f"{fake_provider.url}/discord/api/oauth2/token",
        auth_discord_api_base_url=f"{fake_provider.url}/discord/api/",
        max_messages_per_chat=MAX_MESSAGES_PER_CHAT,
        max_queue_size=MAX_QUEUE_SIZE,
        max_message_length=MAX_MESSAGE_LENGTH,
        max_chats_per_user=MAX_CHATS_PER_USER,
        rate_limit_per_minute=0,
        max_concurrent_generations_per_user=0,
        no_worker_timeout=3600,
        requeue_grace=3600,
        # No worker runs here, so the recovery loop has nothing to do; a long interval keeps it
        # asleep at shutdown (a cancel that lands mid-Redis-call can be lost: reported to the lead).
        recovery_interval=3600,
    )


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=60, shutdown_timeout=30):
        yield application


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        yield http


@pytest.fixture(scope="session")
def login(client: httpx.AsyncClient):
    """Signs a (new, by default) debug user in."""

    async def sign_in(name: str | None = None) -> User:
        name = name or f"user-{uuid.uuid4().hex[:8]}"
        response = await client.get("/auth/callback/debug", params={"code": name})
        assert response.status_code == 200, response.text
        tokens = response.json()
        check = await client.get(
            "/auth/check", headers={"Authorization": f"Bearer {tokens['access_token']['access_token']}"}
        )
        return User(
            name,
            check.json()["user_id"],
            tokens["access_token"]["access_token"],
            tokens["refresh_token"]["access_token"],
        )

    return sign_in


@pytest_asyncio.fixture(loop_scope="session")
async def user(login) -> User:
    return await login()


@pytest_asyncio.fixture(loop_scope="session")
async def other_user(login) -> User:
    return await login()


@pytest_asyncio.fixture(loop_scope="session")
async def live_model(app: FastAPI) -> str:
    """A model of this test alone, with a worker session in the broker that never takes work:
    its answers stay pending (and count towards its queue only)."""
    name = f"test-model-{uuid.uuid4().hex[:6]}"
    config = SMOLLM2_135M.model_copy(update={"name": name})
    live = WorkerSession(
        model_config=config,
        max_parallel_requests=2,
        free_slots=0,
        backend_kind="fake",
        worker_version="test",
        connected_at=0.0,
    )
    await app.state.broker.put_worker_session(live.record(f"ws-test-{uuid.uuid4().hex[:8]}"), ttl=3600)
    return name
