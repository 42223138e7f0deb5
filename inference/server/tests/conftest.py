"""Fixtures shared by the server's tests, whatever package they test.

The real app (in this process, through its lifespan) on a fresh Postgres database and a fresh Redis key
prefix, a fake OAuth provider on loopback, and helpers to sign users in: everything session-scoped and
run on the session's event loop (each test module that uses them sets ``pytestmark = API``), so the app
starts once.

The brokers of the broker contract: a test that asks for ``broker`` or ``make_broker`` runs against the
in-memory and the Redis broker. The Redis runs use the local Redis (``OASST_TEST_REDIS_URL``, default
redis://127.0.0.1:6379/0) under a fresh random key prefix, and delete every key of that prefix
afterwards. Deselect them with ``-m "not redis"`` where no Redis runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from oasst_inference_server.broker import Broker, InMemoryBroker, RedisBroker
from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings
from tests.support.api import (
    ADMIN_TOKEN,
    MAX_CHATS_PER_USER,
    MAX_MESSAGE_LENGTH,
    MAX_MESSAGES_PER_CHAT,
    MAX_QUEUE_SIZE,
    TRUSTED_CLIENT_API_KEYS,
    User,
    register_live_model,
    sign_in,
)
from tests.support.broker_prefixes import delete_prefix, new_prefix
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

    async def sign_in_new(name: str | None = None) -> User:
        return await sign_in(client, name)

    return sign_in_new


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
    return await register_live_model(app)


BrokerFactory = Callable[..., Awaitable[Broker]]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_broker(broker_kind: str) -> AsyncIterator[BrokerFactory]:
    """Builds started brokers of the current kind (options: stream_ttl, stream_maxlen, ...)."""
    created: list[Broker] = []
    prefixes: list[str] = []

    async def factory(**options: Any) -> Broker:
        broker: Broker
        if broker_kind == "memory":
            broker = InMemoryBroker(**options)
        else:
            prefix = options.pop("key_prefix", None) or new_prefix()
            prefixes.append(prefix)
            broker = RedisBroker(REDIS_URL, key_prefix=prefix, **options)
        created.append(broker)
        await broker.start()
        return broker

    yield factory
    for broker in created:
        await broker.close()
    for prefix in prefixes:
        await delete_prefix(prefix)


@pytest.fixture
async def broker(make_broker: BrokerFactory) -> Broker:
    return await make_broker()


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL
