"""Fixtures for the OpenAI-compatible API tests: users with API keys, and official ``openai`` clients.

The stacks are the real ones of the root conftest (server + worker + the CPU backend with SmolLM2);
``limited_stack`` is one more, with a low rate limit, one generation at a time per user, and API
conversations stored as chats.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from tests.support.clients import closing
from tests.support.stacks import BackendProcess, Stack, start_stack

RATE_LIMIT = 3


@dataclass
class ApiUser:
    """A user of a stack: their access token for key management, and official SDK clients."""

    base_url: str
    name: str
    http: httpx.Client = field(init=False)
    token: str = field(init=False)

    def __post_init__(self) -> None:
        self.http = closing(httpx.Client(base_url=self.base_url, timeout=120))
        login = self.http.get("/auth/callback/debug", params={"code": self.name})
        login.raise_for_status()
        self.token = login.json()["access_token"]["access_token"]
        self.http.headers["Authorization"] = f"Bearer {self.token}"

    def create_key(self, name: str = "test key") -> dict[str, Any]:
        response = self.http.post("/api_keys", json={"name": name})
        assert response.status_code == 201, response.text
        return dict(response.json())

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        """An SDK client with ``api_key`` (default: the user's access token); no retries, so errors show."""
        return closing(
            openai.OpenAI(
                base_url=f"{self.base_url}/v1", api_key=api_key or self.token, max_retries=0, timeout=180
            )
        )

    def usage(self) -> dict[str, Any]:
        response = self.http.get("/usage")
        response.raise_for_status()
        return dict(response.json())

    def request_record(self, request_id: str) -> dict[str, Any]:
        response = self.http.get(f"/usage/requests/{request_id}")
        response.raise_for_status()
        return dict(response.json())

    def wait_finished(self, request_id: str, timeout: float = 60) -> dict[str, Any]:
        """The request's usage record once it is no longer pending or in progress."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.request_record(request_id)
            if record["state"] not in ("pending", "in_progress") or time.monotonic() > deadline:
                return record
            time.sleep(0.2)


@pytest.fixture(params=["embedded", "production"])
def stack(request: pytest.FixtureRequest) -> Stack:
    stack: Stack = request.getfixturevalue(f"{request.param}_stack")
    return stack


def new_user(stack: Stack) -> ApiUser:
    return ApiUser(stack.url, f"oai-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def user(stack: Stack) -> Iterator[ApiUser]:
    api_user = new_user(stack)
    yield api_user
    api_user.http.close()


@pytest.fixture
def key(user: ApiUser) -> str:
    return str(user.create_key()["key"])


@pytest.fixture
def client(user: ApiUser, key: str) -> openai.OpenAI:
    return user.client(key)


@pytest.fixture(scope="module")
def limited_stack(cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """SQLite stack with 3 generations per minute, 1 at a time per user, conversations kept as chats, and
    no resume grace (a stream the client closes is cancelled at once)."""
    log_dir = tmp_path_factory.mktemp("limited-stack")
    stack = start_stack(
        log_dir,
        cpu_backend.url,
        f"sqlite+aiosqlite:///{log_dir}/oasst.db",
        None,
        OASST_SERVER_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT),
        OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER="1",
        OASST_SERVER_STORE_API_CONVERSATIONS="true",
        OASST_SERVER_OPENAI_STREAM_RESUME_GRACE_SECONDS="0",  # a closed stream is cancelled at once
    )
    yield stack
    stack.stop()
