"""Structured-output requests that used to kill the backend process, sent to the real backend: each gets
an answer or a TGI validation error (422), and the process is still the same one, healthy, afterwards."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.json_schemas import nested

from .conftest import RunningBackend

pytestmark = pytest.mark.slow

TIMEOUT = 300
SUMMARY_PROMPT = (
    "<|im_start|>user\nSummarize in one sentence: The cat sat on the mat all afternoon and slept in the "
    "sun.<|im_end|>\n<|im_start|>assistant\n"
)


def generate(
    backend: RunningBackend, schema: Any, *, stream: bool = False, tokens: int = 24
) -> httpx.Response:
    body = {
        "inputs": SUMMARY_PROMPT,
        "parameters": {"max_new_tokens": tokens, "grammar": {"type": "json", "value": schema}},
    }
    return httpx.post(
        f"{backend.url}/{'generate_stream' if stream else 'generate'}", json=body, timeout=TIMEOUT
    )


def assert_still_up(backend: RunningBackend, pid: int) -> None:
    assert backend.proc.poll() is None, backend.log()[-3000:]
    assert backend.proc.pid == pid
    assert httpx.get(f"{backend.url}/health", timeout=10).status_code == 200


def test_a_long_but_allowed_max_length_gives_a_valid_answer(backend: RunningBackend) -> None:
    # The request that killed the backend with SIGSEGV on its first token.
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string", "maxLength": 2000}},
        "required": ["summary"],
        "additionalProperties": False,
    }
    pid = backend.proc.pid
    response = generate(backend, schema, tokens=600)
    assert response.status_code == 200, response.text
    answer = json.loads(response.json()["generated_text"])
    assert set(answer) == {"summary"} and 0 < len(answer["summary"]) <= 2000
    streamed = generate(backend, schema, stream=True, tokens=5)
    assert streamed.status_code == 200 and "data:" in streamed.text
    assert_still_up(backend, pid)


@pytest.mark.parametrize(
    ("schema", "names"),
    [
        ({"type": "object", "properties": {"s": {"type": "string", "minLength": 30_000_000}}}, "minLength"),
        ({"type": "string", "maxLength": 100_000}, "maxLength"),
        (nested(40), "nested deeper than 64"),
        (nested(200), "recursion limit"),  # past the request parser's own limit
        ({"type": "array", "items": {"type": "string"}, "maxItems": 1_000_000}, "maxItems"),
        ({"type": "string", "pattern": "^(a{0,99}){0,99}$"}, "pattern"),
        ({"$ref": "#"}, "$ref"),
        ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, "leads back to itself"),
        ({"type": "strin"}, "invalid JSON schema"),
        ('{"type": "object"', "invalid JSON schema"),
        ("[" * 5000 + "]" * 5000, "invalid JSON schema"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_schemas_past_a_bound_are_refused_and_the_backend_stays_up(
    backend: RunningBackend, schema: Any, names: str, stream: bool
) -> None:
    pid = backend.proc.pid
    response = generate(backend, schema, stream=stream)
    assert response.status_code == 422, response.text[:500]
    assert response.json()["error_type"] == "validation"
    assert names in response.json()["error"]
    assert_still_up(backend, pid)


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"phone": {"type": "string", "pattern": r"^\d{3}-\d{4}$"}},
            "required": ["phone"],
        },
        {"type": "object", "properties": {"word": {"enum": ['a"b', "c\\d"]}}, "required": ["word"]},
        {"type": "object", "properties": {"tags": {"type": "array", "items": {}, "maxItems": 300}}},
    ],
)
def test_schemas_that_built_a_grammar_llama_cpp_refused_now_get_answers(
    backend: RunningBackend, schema: dict[str, Any]
) -> None:
    pid = backend.proc.pid
    response = generate(backend, schema, tokens=40)
    assert response.status_code == 200, response.text
    assert_still_up(backend, pid)
