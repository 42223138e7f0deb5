"""Helpers of the REST API tests (imported by the tests; the fixtures are in conftest.py)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi import FastAPI

from oasst_inference_server.auth import oauth
from oasst_inference_server.auth.trusted_client import TrustedClient, encode_trusted_client
from tests.support.sessions import session_record

API = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.asyncio(loop_scope="session")]

ADMIN_TOKEN = "test-admin-root-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TRUSTED_KEY = "test-trusted-frontend-key-0123456789"  # a bare key: the client named "website"
DISCORD_TRUSTED_KEY = "test-trusted-discord-bot-key-0123456789"  # bound to the client named "discord"
TRUSTED_CLIENT_API_KEYS = [TRUSTED_KEY, f"discord:{DISCORD_TRUSTED_KEY}"]
MAX_MESSAGES_PER_CHAT = 8
MAX_QUEUE_SIZE = 4
MAX_MESSAGE_LENGTH = 2000
MAX_CHATS_PER_USER = 30


@dataclass
class User:
    name: str
    id: str
    access_token: str
    refresh_token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token}"}


def trusted_header(user_id: str | None = None, api_key: str | None = None, **fields: str) -> dict[str, str]:
    client = fields.get("client", "website")
    if api_key is None:
        api_key = DISCORD_TRUSTED_KEY if client == "discord" else TRUSTED_KEY
    info = TrustedClient(
        api_key=api_key,
        client=client,
        user_id=user_id or str(uuid.uuid4()),
        provider_account_id=fields.get("provider_account_id", f"acct-{uuid.uuid4().hex[:8]}"),
        username=fields.get("username", "Web User"),
    )
    return {"TrustedClient": encode_trusted_client(info)}


@dataclass
class Conversation:
    chat_id: str
    prompter_id: str
    assistant_id: str | None = None


async def start_chat(
    client: httpx.AsyncClient, user: User, content: str = "Hello there", model: str | None = None
) -> Conversation:
    """A chat with one prompt and, given a model, one (pending) answer."""
    chat = await client.post("/chats", json={}, headers=user.headers)
    assert chat.status_code == 200, chat.text
    chat_id = chat.json()["id"]
    prompter = await client.post(
        f"/chats/{chat_id}/prompter_message", json={"content": content}, headers=user.headers
    )
    assert prompter.status_code == 200, prompter.text
    conversation = Conversation(chat_id, prompter.json()["id"])
    if model:
        conversation.assistant_id = await answer(client, user, chat_id, conversation.prompter_id, model)
    return conversation


async def answer(client: httpx.AsyncClient, user: User, chat_id: str, parent_id: str, model: str) -> str:
    response = await client.post(
        f"/chats/{chat_id}/assistant_message",
        json={"parent_id": parent_id, "model_config_name": model},
        headers=user.headers,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def follow_up(client: httpx.AsyncClient, user: User, chat_id: str, parent_id: str, content: str) -> str:
    """The id of a new prompter message answering the assistant message ``parent_id``."""
    response = await client.post(
        f"/chats/{chat_id}/prompter_message",
        json={"parent_id": parent_id, "content": content},
        headers=user.headers,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def set_content(app: FastAPI, message_id: str, content: str) -> None:
    """Store ``content`` as the message's, past every bound the API keeps (as a message from before)."""
    from sqlalchemy import update

    from oasst_inference_server.db.models import DbMessage

    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage).where(DbMessage.id == message_id).values(content=content)  # type: ignore[arg-type]
        )
        await session.commit()


async def finish_message(app: FastAPI, message_id: str, content: str = "An answer.") -> None:
    """Complete a pending answer as a worker would (no worker runs in these tests)."""
    from sqlalchemy import update

    from oasst_inference_server.db.models import DbMessage, utcnow

    async with app.state.session_factory() as session:
        await session.exec(
            update(DbMessage)
            .where(DbMessage.id == message_id)  # type: ignore[arg-type]
            .values(state="complete", content=content, finished_at=utcnow(), finish_reason="eos_token")
        )
        await session.commit()


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"detail", "code"}, body
    if code is not None:
        assert body["code"] == code, body
    return body


async def start_sign_in(client, provider: str) -> tuple[str, str, str]:
    """GET /auth/login/{provider}; returns (the provider URL, state, the nonce cookie)."""
    response = await client.get(f"/auth/login/{provider}")
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    nonce = response.cookies.get(oauth.STATE_COOKIE)
    assert nonce and "httponly" in response.headers["set-cookie"].lower()
    client.cookies.clear()  # each test sends the cookie it means to (the client is shared)
    return location, parse_qs(urlsplit(location).query)["state"][0], nonce


async def provider_redirect(location: str) -> tuple[str, dict[str, str]]:
    """Follow the browser to the provider, which redirects back with a code."""
    async with httpx.AsyncClient() as browser:
        response = await browser.get(location)
    assert response.status_code == 302
    back = response.headers["location"]
    return back, {k: v[0] for k, v in parse_qs(urlsplit(back).query).items()}


async def get_with_cookies(
    client: httpx.AsyncClient, url: str, cookies: dict[str, str], **kwargs: Any
) -> httpx.Response:
    """GET ``url`` sending ``cookies`` as well (httpx deprecates per-request cookies): they are set on the
    shared client for this request only, unless the response changed them."""
    for name, value in cookies.items():
        client.cookies.set(name, value)
    try:
        return await client.get(url, **kwargs)
    finally:
        for name, value in cookies.items():
            if client.cookies.get(name) == value:
                client.cookies.delete(name)


async def sign_in(client: httpx.AsyncClient, name: str | None = None) -> User:
    """Sign a (new, by default) debug user in."""
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


async def register_live_model(app: FastAPI) -> str:
    """A model of its own, with a worker session in the broker that never takes work: its answers
    stay pending (and count towards its queue only). Returns its name."""
    name = f"test-model-{uuid.uuid4().hex[:6]}"
    record = session_record(f"ws-test-{uuid.uuid4().hex[:8]}", name)
    await app.state.broker.put_worker_session(record, ttl=3600)
    return name
