"""The Anthropic Messages API's refusals in the app: every error under ``/v1/messages`` in Anthropic's
shape and statuses (authentication, validation, bounds, the edge's refusals, unknown routes), while the
OpenAI routes keep theirs."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.api import API

pytestmark = API


def message(**fields: Any) -> dict[str, Any]:
    return {"model": "any", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error", body
    assert body["error"]["type"] == kind and body["request_id"].startswith("req_")
    assert response.headers["request-id"] == body["request_id"]
    return str(body["error"]["message"])


async def test_authentication_takes_x_api_key_or_bearer(client, user) -> None:
    said = assert_anthropic_error(
        await client.post("/v1/messages", json=message()), 401, "authentication_error"
    )
    assert "x-api-key" in said
    bad = {"x-api-key": "oak-not-a-key", "anthropic-version": "2023-06-01"}
    assert_anthropic_error(
        await client.post("/v1/messages", json=message(), headers=bad), 401, "authentication_error"
    )
    key = (await client.post("/api_keys", json={"name": "k"}, headers=user.headers)).json()["key"]
    for headers in ({"x-api-key": key}, {"Authorization": f"Bearer {key}"}):
        # Past authentication: the unknown model is what is refused.
        said = assert_anthropic_error(
            await client.post("/v1/messages", json=message(), headers=headers), 404, "not_found_error"
        )
        assert "'any'" in said


async def test_validation_errors_are_400s_naming_the_field(client, user) -> None:
    async def refused(body: dict[str, Any]) -> str:
        response = await client.post("/v1/messages", json=body, headers=user.headers)
        return assert_anthropic_error(response, 400, "invalid_request_error")

    without = message()
    del without["max_tokens"]
    assert (await refused(without)).startswith("max_tokens: ")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    assert "image blocks are not supported" in await refused(
        message(messages=[{"role": "user", "content": [image]}])
    )
    assert "server tools" in await refused(message(tools=[{"type": "bash_20250124", "name": "bash"}]))
    assert "top_k" in await refused(message(top_k=-1))
    assert_anthropic_error(
        await client.post(
            "/v1/messages", content=b"{not json", headers={**user.headers, "content-type": "application/json"}
        ),
        400,
        "invalid_request_error",
    )


async def test_the_deployments_bounds_are_invalid_requests(client, user, settings) -> None:
    async def refused(body: dict[str, Any]) -> str:
        response = await client.post("/v1/messages", json=body, headers=user.headers)
        return assert_anthropic_error(response, 400, "invalid_request_error")

    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    many = turns * (settings.max_messages_per_request // 2) + [{"role": "user", "content": "hi"}]
    assert "messages" in await refused(message(messages=many))
    long_system = "s" * (settings.max_system_prompt_length + 1)
    assert "system prompt" in await refused(message(system=[{"type": "text", "text": long_system}]))
    long_message = "u" * (settings.max_message_length + 1)
    assert "characters" in await refused(message(messages=[{"role": "user", "content": long_message}]))
    assert "at most 4" in await refused(message(stop_sequences=["a", "b", "c", "d", "e"]))
    assert "max_tokens" in await refused(message(max_tokens=10**7))


async def test_the_edges_refusals_take_anthropics_shape(client, user, settings) -> None:
    huge = b'{"x": "' + b"a" * (settings.max_request_body_bytes + 1) + b'"}'
    headers = {**user.headers, "content-type": "application/json"}
    assert_anthropic_error(
        await client.post("/v1/messages", content=huge, headers=headers), 413, "invalid_request_error"
    )
    deep = b"[" * 200 + b"]" * 200
    assert_anthropic_error(
        await client.post("/v1/messages/count_tokens", content=deep, headers=headers),
        400,
        "invalid_request_error",
    )
    assert_anthropic_error(
        await client.post("/v1/messages/nope", json={}, headers=headers), 404, "not_found_error"
    )


async def test_the_openai_routes_keep_openais_shape(client) -> None:
    response = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
    assert response.status_code == 401 and set(response.json()) == {"error"}
    assert response.json()["error"]["type"] == "authentication_error"
