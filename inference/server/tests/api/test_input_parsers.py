"""Every parser of client input, fed deeply nested, huge and malformed input: a 4xx with a JSON error
body every time, never a 500 or a traceback.

The request head's own bounds (its size, its deadline, the connection cap) are below the app, in the
protocol uvicorn runs: tests/e2e/test_connection_limits.py, against real server processes.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from oasst_inference_server.auth import oauth
from oasst_inference_server.main import create_app
from oasst_shared.limits import MAX_JSON_DEPTH
from tests.support.api import API, get_with_cookies, start_chat, start_sign_in, trusted_header

pytestmark = API

DEEP = (MAX_JSON_DEPTH + 1, 10_000, 100_000)


def assert_refused(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """A refusal in the REST shape or, under /v1/, OpenAI's; never a traceback."""
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text and 'File "' not in response.text
    body = response.json()
    error = body["error"] if "error" in body else body
    assert error.get("message") or error.get("detail"), body
    if code is not None:
        assert error["code"] == code, body
    return error


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def nested(depth: int, kind: str = "array") -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth if kind == "object" else b"[" * depth + b"]" * depth


JSON = {"Content-Type": "application/json"}

# ---------------------------------------------------------------- JSON bodies


@pytest.mark.parametrize("depth", DEEP)
@pytest.mark.parametrize("kind", ["array", "object"])
async def test_a_json_body_nested_past_the_bound_is_refused_before_it_is_parsed(client, user, depth, kind):
    body = nested(depth, kind)
    conversation = await start_chat(client, user)
    for path, status in (
        ("/chats", 422),
        (f"/chats/{conversation.chat_id}/prompter_message", 422),
        ("/auth/refresh", 422),  # before authentication, too
        ("/v1/chat/completions", 400),
        ("/v1/embeddings", 400),
    ):
        error = assert_refused(
            await client.post(path, content=body, headers={**user.headers, **JSON}), status, "json_too_deep"
        )
        message = error.get("message") or error["detail"]
        assert str(MAX_JSON_DEPTH) in message, message
    # Also inside an ordinary request: a response format whose schema nests too deeply.
    schema: Any = {"type": "string"}
    for _ in range(MAX_JSON_DEPTH):
        schema = {"type": "array", "items": schema}
    completion = {
        "model": "any",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}},
    }
    assert_refused(
        await client.post("/v1/chat/completions", json=completion, headers=user.headers), 400, "json_too_deep"
    )


async def test_nesting_within_the_bound_and_brackets_inside_strings_pass_the_guard(client, user):
    # At the bound: the body reaches validation (which refuses it for what it is, not for its depth).
    at_bound = b'{"x":' + nested(MAX_JSON_DEPTH - 1) + b"}"
    assert_refused(
        await client.post("/auth/refresh", content=at_bound, headers=JSON), 422, "validation_error"
    )
    # Brackets in strings are text, escaped quotes and backslashes among them.
    content = '[{"\\' * 475
    chat = (await client.post("/chats", json={}, headers=user.headers)).json()["id"]
    response = await client.post(
        f"/chats/{chat}/prompter_message", json={"content": content}, headers=user.headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["content"] == content
    title = await client.patch(f"/chats/{chat}", json={"title": "[[[[" * 50}, headers=user.headers)
    assert title.status_code == 200, title.text


async def test_a_malformed_json_body_is_a_4xx(client, user):
    huge_number = b'{"model": "m", "messages": [], "seed": ' + b"9" * 5_000 + b"}"  # int() refuses it
    for body in (
        b"{",
        b'{"a": }',
        b"[1, 2",
        b'{"a": "unterminated}',
        b"]]]]",
        b"{}}}}",
        b'{"a": nan}',
        huge_number,
    ):
        response = await client.post("/chats", content=body, headers={**user.headers, **JSON})
        assert 400 <= response.status_code < 500, (body, response.text)
        assert "Traceback" not in response.text
        response = await client.post("/v1/chat/completions", content=body, headers={**user.headers, **JSON})
        assert response.status_code == 400, (body, response.text)


# ---------------------------------------------------------------- an unexpected failure


async def test_an_unhandled_exception_answers_500_with_connection_close_and_no_traceback(settings):
    app: FastAPI = create_app(settings)

    async def broken() -> None:
        raise RuntimeError("the secret internals of this failure")

    app.add_api_route("/broken", broken)
    app.add_api_route("/v1/broken", broken)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        for path, shape in (("/broken", "detail"), ("/v1/broken", "error")):
            response = await http.get(path)
            assert response.status_code == 500
            assert response.headers["connection"] == "close"
            assert shape in response.json()
            assert "secret internals" not in response.text and "Traceback" not in response.text


# ---------------------------------------------------------------- Authorization: Bearer


def jwt_with(header: bytes, payload: bytes) -> str:
    return f"{b64(header)}.{b64(payload)}.{b64(b'not a signature')}"


GOOD_HEADER = b'{"alg":"HS256","typ":"JWT"}'
BAD_BEARERS: list[str | bytes] = [
    "Bearer " + jwt_with(nested(20_000), b"{}"),  # a deep token header (parsed before the signature)
    "Bearer " + jwt_with(GOOD_HEADER, nested(20_000, "object")),
    "Bearer " + jwt_with(b'{"alg":' * 5_000 + b"1" + b"}" * 5_000, b"{}"),
    "Bearer " + "a" * 30_000,
    "Bearer oak-" + "x" * 30_000,  # an API key's shape
    "Bearer a.b",
    "Bearer ...",
    "Bearer",
    "Basic dXNlcjpwYXNz",
    b"Bearer \xff\xfe\x80",  # not text at all
    "Bearer " + jwt_with(GOOD_HEADER, b'{"sub": ["x"], "kind": "access", "gen": {"a": 1}}'),
]


@pytest.mark.parametrize("authorization", BAD_BEARERS, ids=range(len(BAD_BEARERS)))
async def test_a_bad_bearer_token_is_a_401_on_every_kind_of_route(client, authorization):
    headers = {"Authorization": authorization}
    assert_refused(await client.get("/auth/check", headers=headers), 401)
    assert_refused(await client.get("/account", headers=headers), 401)
    assert_refused(await client.get("/v1/models", headers=headers), 401)


async def test_a_bad_refresh_token_is_a_4xx_in_the_header_and_the_body(client):
    for token in (jwt_with(nested(20_000), b"{}"), "r" * 30_000, "x", ".."):
        assert_refused(await client.post("/auth/refresh", headers={"Refresh": token}), 401)
    assert_refused(await client.post("/auth/refresh", headers={"Refresh": b"\xff\xfe"}), 401)
    assert_refused(await client.post("/auth/refresh", json={"refresh_token": "r" * 600}), 422)
    assert_refused(await client.post("/auth/refresh", json={"refresh_token": ["r"]}), 422)
    assert_refused(await client.post("/auth/logout", json={"refresh_token": {"a": [1]}}), 422)


# ---------------------------------------------------------------- TrustedClient


def _trusted(payload: bytes) -> dict[str, str]:
    return {"TrustedClient": base64.b64encode(payload).decode()}


BAD_TRUSTED = [
    _trusted(nested(20_000)),
    _trusted(b'{"api_key": ' + nested(5_000, "object") + b"}"),
    _trusted(
        b'{"api_key": {"a": "b"}, "client": "website", "user_id": "u", "provider_account_id": "p", "username": "n"}'
    ),
    _trusted(b"[1, 2, 3]"),
    _trusted(b'"a string"'),
    _trusted(b"\xff\xfe not text"),
    _trusted(b"{" * 3),
    {"TrustedClient": "!!! not base64 !!!"},
    {"TrustedClient": "A" * 30_000},
    {"TrustedClient": trusted_header()["TrustedClient"] + "=" * 9000},
]


@pytest.mark.parametrize("headers", BAD_TRUSTED, ids=range(len(BAD_TRUSTED)))
async def test_a_bad_trusted_client_header_is_a_401(client, headers):
    assert_refused(await client.post("/auth/trusted", headers=headers), 401, "invalid_trusted_client")
    assert_refused(await client.get("/auth/check", headers=headers), 401, "invalid_trusted_client")
    # As the proof of a trusted client that may set a priority, it proves nothing.
    assert_refused(await client.post("/chats", json={}, headers={**headers, "X-Priority": "1"}), 401)


# ---------------------------------------------------------------- scheduling headers


async def test_bad_scheduling_headers_are_4xx(client, user, live_model):
    conversation = await start_chat(client, user)
    url = f"/chats/{conversation.chat_id}/assistant_message"
    body = {"parent_id": conversation.prompter_id, "model_config_name": live_model}
    completion = {"model": live_model, "messages": [{"role": "user", "content": "hi"}]}
    for bad in ("inf", "-inf", "1e999", "9" * 30_000, "0x10", "", b"\xc2\xb2", b"\xff", "1" * 5_000 + ".5"):
        headers = {**user.headers, "X-Queue-Timeout": bad}
        assert_refused(await client.post(url, json=body, headers=headers), 422, "invalid_queue_timeout")
        assert_refused(
            await client.post("/v1/chat/completions", json=completion, headers=headers),
            400,
            "invalid_queue_timeout",
        )
    web = trusted_header()
    chat = (await client.post("/chats", json={}, headers=web)).json()["id"]
    prompt = (
        await client.post(f"/chats/{chat}/prompter_message", json={"content": "hi"}, headers=web)
    ).json()
    body = {"parent_id": prompt["id"], "model_config_name": live_model}
    # int() refuses more than 4,300 digits with a ValueError of its own; "\xb2" (a superscript two) is a
    # digit to str.isdigit.
    for bad in ("9" * 5_000, "1" * 30_000, b"\xc2\xb2", "1.5", "", "+-1"):
        assert_refused(
            await client.post(
                f"/chats/{chat}/assistant_message", json=body, headers={**web, "X-Priority": bad}
            ),
            422,
            "invalid_priority",
        )


# ---------------------------------------------------------------- Last-Event-ID


async def test_a_bad_last_event_id_is_a_400(client, user, live_model):
    conversation = await start_chat(client, user)
    answer = await client.post(
        f"/chats/{conversation.chat_id}/assistant_message",
        json={"parent_id": conversation.prompter_id, "model_config_name": live_model},
        headers=user.headers,
    )
    assert answer.status_code == 200, answer.text
    url = f"/chats/{conversation.chat_id}/messages/{answer.json()['id']}/events"
    for bad in (
        "$",
        "+",
        "1-2-3",
        "1" * 30_000,
        "99999999999999999999999-0",
        "-1",
        "1-",
        b"\xd9\xa3",
        "[[[[",
    ):
        assert_refused(
            await client.get(url, headers={**user.headers, "Last-Event-ID": bad}),
            400,
            "invalid_last_event_id",
        )
    await client.post(
        f"/chats/{conversation.chat_id}/messages/{answer.json()['id']}/cancel", headers=user.headers
    )


# ---------------------------------------------------------------- OAuth: state and cookie


async def test_a_bad_oauth_state_or_cookie_is_a_4xx(client, fake_provider):
    _, state, nonce = await start_sign_in(client, "github")
    url = "/auth/callback/github"
    cookie = {oauth.STATE_COOKIE: nonce}
    deep_states = [
        jwt_with(GOOD_HEADER, nested(1_400)),  # fits the state's 4,096 characters
        jwt_with(nested(1_400), b"{}"),
        jwt_with(GOOD_HEADER, b'{"web": ' + nested(1_400) + b"}"),
        "a.b.c",
        "..",
        "é" * 100,
    ]
    for bad in deep_states:
        response = await get_with_cookies(client, url, cookie, params={"code": "c", "state": bad})
        assert_refused(response, 400, "oauth_state_invalid")
    assert_refused(
        await get_with_cookies(client, url, cookie, params={"code": "c", "state": "s" * 5_000}), 422
    )
    # The cookie: missing, huge, not ASCII (compared as bytes: str comparison refuses non-ASCII).
    params = {"code": "c", "state": state}
    assert_refused(await client.get(url, params=params), 400, "oauth_state_mismatch")
    for raw in (b"\xc3\xa9" * 10, b"n" * 30_000, b"\xff"):
        headers = {"Cookie": oauth.STATE_COOKIE.encode() + b"=" + raw}
        assert_refused(await client.get(url, params=params, headers=headers), 400, "oauth_state_mismatch")


# ---------------------------------------------------------------- query strings


async def test_bad_query_strings_are_4xx(client, user):
    def cursor(text: str) -> str:
        return b64(text.encode())

    for bad in (
        "!!!",
        "é",
        cursor("2020-01-01T00:00:00|x"),  # a time without its zone
        cursor("not a time|x"),
        cursor("no separator"),
        b64(b"\xff\xfe|x"),
    ):
        for name in ("after", "before"):
            response = await client.get("/chats", params={name: bad}, headers=user.headers)
            assert_refused(response, 400, "invalid_cursor")
    assert_refused(await client.get("/chats", params={"after": "c" * 201}, headers=user.headers), 422)
    assert_refused(await client.get("/chats", params={"limit": "9" * 5_000}, headers=user.headers), 422)
    assert_refused(await client.get("/chats", params={"limit": "1e3"}, headers=user.headers), 422)
    assert_refused(await client.get("/usage/requests", params={"limit": "-1"}, headers=user.headers), 422)
    for name in ("alice\n", "alice\r\n", "\nalice", "al ice", "a" * 65):
        assert_refused(await client.get("/auth/callback/debug", params={"code": name}), 422)
        assert_refused(await client.get("/auth/login/debug", params={"username": name}), 422)
