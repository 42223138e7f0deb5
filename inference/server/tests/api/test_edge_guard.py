"""The edge: bodies bounded before authentication and parsing, invalid text refused on every API,
and what production serves."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager

from oasst_inference_server.api.edge_guard import text_problem
from oasst_inference_server.main import create_app
from oasst_inference_server.settings import Settings
from tests.support.api import API, assert_error, start_chat

pytestmark = API


async def test_a_declared_oversized_body_is_refused_before_authentication(client, settings):
    too_big = settings.max_request_body_bytes + 1
    # No credentials at all: the size is refused first (413, not 401), from the header alone.
    response = await client.post(
        "/chats", content=b"{}", headers={"Content-Length": str(too_big), "Content-Type": "application/json"}
    )
    body = assert_error(response, 413, "request_too_large")
    assert "OASST_SERVER_MAX_REQUEST_BODY_BYTES" in body["detail"]
    # The OpenAI-compatible API answers in its own error shape.
    response = await client.post(
        "/v1/chat/completions", content=b"{}", headers={"Content-Length": str(too_big)}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


async def test_a_streamed_body_is_cut_off_at_the_limit(client, settings):
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(64):
            sent += 1
            yield b"x" * (settings.max_request_body_bytes // 8)

    # A chunked body (no Content-Length) is counted as it arrives and refused past the limit.
    response = await client.post("/chats", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(response, 413, "request_too_large")
    assert sent < 64  # the rest of the body was never read


async def test_a_bad_content_length_is_refused(client):
    response = await client.post("/chats", content=b"{}", headers={"Content-Length": "12x"})
    assert_error(response, 400, "invalid_content_length")


@pytest.mark.parametrize(
    "text",
    ["nul \u0000 inside", "lone \ud800 high", "lone \udfff low", "reversed \udc00\ud800 pair"],
    ids=["nul", "high", "low", "reversed"],
)
async def test_invalid_text_is_refused_on_the_chat_api_and_v1(client, user, text):
    conversation = await start_chat(client, user)
    # json.dumps writes NUL and lone surrogates as \u escapes: the way a client can send them.
    body = json.dumps({"content": text, "parent_id": conversation.prompter_id}).encode()
    response = await client.post(
        f"/chats/{conversation.chat_id}/prompter_message",
        content=body,
        headers={**user.headers, "Content-Type": "application/json"},
    )
    assert_error(response, 422, "invalid_text")
    title = json.dumps({"title": text}).encode()
    assert_error(
        await client.patch(
            f"/chats/{conversation.chat_id}",
            content=title,
            headers={**user.headers, "Content-Type": "application/json"},
        ),
        422,
        "invalid_text",
    )
    completion = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    response = await client.post(
        "/v1/chat/completions",
        content=completion,
        headers={**user.headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_text"


async def test_invalid_bytes_in_the_body_path_or_query_are_refused(client, user):
    assert_error(
        await client.post("/chats", content=b'{"title": "\xff\xfe"}', headers=user.headers),
        422,
        "invalid_text",
    )
    assert_error(await client.get("/chats/abc%00def", headers=user.headers), 422, "invalid_text")
    assert_error(await client.get("/chats?after=%ED%A0%80", headers=user.headers), 422, "invalid_text")
    assert_error(await client.get("/chats?after=a%00", headers=user.headers), 422, "invalid_text")


async def test_the_text_check_reads_json_escapes_exactly():
    ok = [b'{"a": "\\\\u0000"}', b'{"a": "\\ud83d\\ude00"}', b'{"a": "\\u00e9\\n"}', "é 😀".encode()]
    for body in ok:
        assert text_problem(body, json_escapes=True) is None, body
    bad = [b'{"a": "\\u0000"}', b'{"a": "\\ud83d"}', b'{"a": "\\ude00"}', b'{"a": "\\ud83d\\n"}', b"\x00"]
    for body in bad:
        assert text_problem(body, json_escapes=True) is not None, body


# ---------------------------------------------------------------- production serves less


def production_settings(settings: Settings, **overrides: object) -> Settings:
    values = {
        **settings.model_dump(),
        "environment": "production",
        "auth_secret": secrets.token_hex(32),
        "worker_api_keys": [],
        "allow_debug_auth": None,
        "docs_enabled": None,
        "metrics_enabled": None,
        "auth_github_client_id": None,
        "auth_discord_client_id": None,
        "trusted_client_api_keys": [],
        "admin_root_token": None,
        **overrides,
    }
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


async def _served(settings: Settings, path: str, headers: dict[str, str] | None = None) -> int:
    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=60, shutdown_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return (await http.get(path, headers=headers)).status_code


async def test_production_serves_docs_and_metrics_only_when_configured(settings):
    closed = production_settings(settings)
    for path in ("/docs", "/redoc", "/openapi.json", "/metrics"):
        assert await _served(closed, path) == 404, path
    assert await _served(closed, "/auth/callback/debug?code=x") == 403  # no debug login either
    token = secrets.token_hex(32)
    metrics = production_settings(settings, metrics_enabled=True, metrics_token=token)
    assert await _served(metrics, "/metrics") == 401
    assert await _served(metrics, "/metrics", {"Authorization": f"Bearer {token}"}) == 200
    docs = production_settings(settings, docs_enabled=True)
    assert await _served(docs, "/openapi.json") == 200


async def test_a_body_that_does_not_arrive_in_time_is_refused_with_408(settings):
    app = create_app(settings.model_copy(update={"request_body_timeout": 0.5}))
    sent = 0

    async def trickle() -> AsyncIterator[bytes]:
        nonlocal sent
        for byte in b'{"title": "a title that arrives a byte at a time"}':
            sent += 1
            yield bytes([byte])
            await asyncio.sleep(0.1)

    transport = httpx.ASGITransport(app=app)
    async with (
        LifespanManager(app, startup_timeout=60, shutdown_timeout=30),
        httpx.AsyncClient(transport=transport, base_url="http://testserver") as http,
    ):
        # No credentials: the deadline is the edge's, before authentication.
        response = await http.post("/chats", content=trickle(), headers={"Content-Type": "application/json"})
        body = assert_error(response, 408, "request_timeout")
        assert "OASST_SERVER_REQUEST_BODY_TIMEOUT" in body["detail"]
        assert response.headers["connection"] == "close"
        assert sent < 20  # the rest was never read
        response = await http.post("/v1/chat/completions", content=trickle())
        assert response.status_code == 408 and response.json()["error"]["code"] == "request_timeout"
        # A body that arrives in time passes (and meets authentication).
        assert (await http.post("/chats", json={"title": "t"})).status_code == 401
