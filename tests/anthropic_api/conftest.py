"""Fixtures for the Anthropic Messages API tests: users with API keys, and official ``anthropic`` clients.

The stacks are the real ones of the root conftest (server + worker + the CPU backend with SmolLM2);
``limited_stack`` is one more, with a low rate limit and one generation at a time per user.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anthropic
import pytest

from tests.openai_api.conftest import ApiUser
from tests.support.clients import closing
from tests.support.stacks import BackendProcess, Stack, start_stack

RATE_LIMIT = 3


def anthropic_client(user: ApiUser, api_key: str, **options: object) -> anthropic.Anthropic:
    """An SDK client on the server (the SDK adds ``/v1/messages``); no retries, so errors show."""
    return closing(
        anthropic.Anthropic(base_url=user.base_url, api_key=api_key, max_retries=0, timeout=180, **options)  # type: ignore[arg-type]
    )


@pytest.fixture(params=["embedded", "production"])
def stack(request: pytest.FixtureRequest) -> Stack:
    stack: Stack = request.getfixturevalue(f"{request.param}_stack")
    return stack


@pytest.fixture
def user(stack: Stack) -> Iterator[ApiUser]:
    api_user = ApiUser(stack.url, f"ant-{uuid.uuid4().hex[:10]}")
    yield api_user
    api_user.http.close()


@pytest.fixture
def key(user: ApiUser) -> str:
    return str(user.create_key()["key"])


@pytest.fixture
def client(user: ApiUser, key: str) -> anthropic.Anthropic:
    return anthropic_client(user, key)


@pytest.fixture(scope="module")
def limited_stack(cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """SQLite stack with 3 generations per minute and 1 at a time per user."""
    log_dir = tmp_path_factory.mktemp("anthropic-limited-stack")
    stack = start_stack(
        log_dir,
        cpu_backend.url,
        f"sqlite+aiosqlite:///{log_dir}/oasst.db",
        None,
        OASST_SERVER_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT),
        OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER="1",
    )
    yield stack
    stack.stop()
