"""Bad requests get TGI-shaped JSON errors (never a 500 or a traceback), and the client raises its own
exception types for them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from text_generation import AsyncClient, Client
from text_generation.errors import ValidationError, parse_error

from .conftest import CHAT_PROMPT, COUNTING_PROMPT, RunningBackend

pytestmark = pytest.mark.slow

TIMEOUT = 120


def assert_validation_error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error_type"] == "validation"
    assert isinstance(body["error"], str) and body["error"]
    assert "Traceback" not in response.text
    assert isinstance(parse_error(response.status_code, body), ValidationError)
    return body


def test_prompt_longer_than_the_context_is_a_validation_error(backend: RunningBackend) -> None:
    with pytest.raises(ValidationError, match="inputs"):
        Client(backend.url, timeout=TIMEOUT).generate("word " * 3000, max_new_tokens=5)


async def test_prompt_too_long_for_a_stream_is_a_validation_error(backend: RunningBackend) -> None:
    with pytest.raises(ValidationError, match="inputs"):
        async for _ in AsyncClient(backend.url, timeout=TIMEOUT).generate_stream(
            "word " * 3000, max_new_tokens=5
        ):
            pass


def test_max_new_tokens_beyond_the_context_is_a_validation_error(backend: RunningBackend) -> None:
    with pytest.raises(ValidationError, match="max_new_tokens"):
        Client(backend.url, timeout=TIMEOUT).generate(CHAT_PROMPT, max_new_tokens=2048)


def test_bad_temperature_is_rejected_by_client_and_backend(backend: RunningBackend) -> None:
    # The client refuses before sending; the backend must refuse the same request from any other sender.
    with pytest.raises(ValidationError):
        Client(backend.url, timeout=TIMEOUT).generate(CHAT_PROMPT, temperature=0.0)
    for temperature in (0, -1.5):
        body = {"inputs": CHAT_PROMPT, "parameters": {"temperature": temperature}}
        error = assert_validation_error(httpx.post(backend.url, json=body, timeout=TIMEOUT))
        assert "temperature" in error["error"]


@pytest.mark.parametrize(
    ("parameters", "mentions"),
    [
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"typical_p": 0}, "typical_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"seed": -1}, "seed"),
        ({"truncate": 0}, "truncate"),
        ({"top_n_tokens": 6}, "top_n_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"best_of": 2, "do_sample": True}, "best_of"),
        ({"grammar": {"type": "regex", "value": "[a-z]+"}}, "regex"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"stop": "not-a-list"}, "stop"),
        ({"grammar": {"type": "yaml", "value": "x"}}, "grammar"),
    ],
)
def test_invalid_parameters(backend: RunningBackend, parameters: dict[str, Any], mentions: str) -> None:
    for path in ("/", "/generate", "/generate_stream"):
        body = {"inputs": COUNTING_PROMPT, "parameters": parameters}
        error = assert_validation_error(httpx.post(f"{backend.url}{path}", json=body, timeout=TIMEOUT))
        assert mentions in error["error"]


def test_best_of_above_one_raises_the_clients_validation_error(backend: RunningBackend) -> None:
    with pytest.raises(ValidationError, match="best_of"):
        Client(backend.url, timeout=TIMEOUT).generate(CHAT_PROMPT, best_of=2, do_sample=True)


def test_decoder_input_details_cannot_be_streamed(backend: RunningBackend) -> None:
    body = {"inputs": CHAT_PROMPT, "parameters": {"decoder_input_details": True}, "stream": True}
    assert_validation_error(httpx.post(backend.url, json=body, timeout=TIMEOUT))


# /tokenize reads only "inputs": an empty text or odd generation parameters are no error there.
TOKENIZE_ACCEPTS = {
    b'{"inputs": ""}',
    b'{"inputs": "hi", "parameters": {"temperature": NaN}}',
    b'{"inputs": "hi", "parameters": {"temperature": 1e999}}',
}


@pytest.mark.parametrize(
    "content",
    [
        b"{bad json",
        b"",
        b"[1, 2]",
        b'"just a string"',
        b"{}",
        b'{"inputs": 5}',
        b'{"inputs": null}',
        b'{"inputs": ""}',
        b'{"inputs": "hi", "parameters": "x"}',
        b'{"inputs": "hi", "parameters": {"temperature": NaN}}',
        b'{"inputs": "hi", "parameters": {"temperature": 1e999}}',
        '{"inputs": "caf\xe9"'.encode("latin-1"),
    ],
)
def test_malformed_bodies_are_422_json(backend: RunningBackend, content: bytes) -> None:
    for path in ("/", "/generate", "/generate_stream", "/tokenize"):
        response = httpx.post(
            f"{backend.url}{path}",
            content=content,
            headers={"content-type": "application/json"},
            timeout=TIMEOUT,
        )
        if path == "/tokenize" and content in TOKENIZE_ACCEPTS:
            assert response.status_code == 200, response.text
            continue
        assert_validation_error(response)


def test_unknown_routes_and_methods_answer_json(backend: RunningBackend) -> None:
    missing = httpx.get(f"{backend.url}/no-such-route", timeout=TIMEOUT)
    assert missing.status_code == 404 and missing.json()["error"]
    wrong_method = httpx.get(f"{backend.url}/generate", timeout=TIMEOUT)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]


def test_validation_errors_are_counted(backend: RunningBackend) -> None:
    before = backend.metric('oasst_cpu_backend_requests_total{outcome="validation_error"}')
    httpx.post(f"{backend.url}/generate", content=b"{oops", timeout=TIMEOUT)
    assert backend.metric('oasst_cpu_backend_requests_total{outcome="validation_error"}') == before + 1


def test_an_oversized_body_is_refused_before_parsing(backend: RunningBackend) -> None:
    body = json.dumps({"inputs": "a" * (9 * 1024 * 1024)}).encode()
    error = assert_validation_error(httpx.post(f"{backend.url}/generate", content=body, timeout=TIMEOUT))
    assert "exceeds" in error["error"]

    async def chunks() -> AsyncIterator[bytes]:
        # No content-length: the limit must hold for a streamed (chunked) upload too.
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(timeout=TIMEOUT) as http:
            return await http.post(f"{backend.url}/generate", content=chunks())

    assert_validation_error(asyncio.run(send()))
