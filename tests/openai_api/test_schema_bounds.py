"""Schemas that expand downstream, through the real server, worker and CPU backend (SmolLM2): a schema past a
bound is a 400 naming its field on both APIs, before anything is queued; an ordinary long one still gets a
valid answer; a schema only the backend refuses fails that message alone; the backend process is the
same one, healthy, after all of it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.e2e.chat_api import ChatApi
from tests.openai_api.conftest import ApiUser
from tests.support.json_schemas import nested
from tests.support.stacks import BackendProcess, Stack

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"summary": {"type": "string", "maxLength": 2000}},
    "required": ["summary"],
    "additionalProperties": False,
}
ARTICLE = "The cat sat on the mat all afternoon and slept in the warm sun while the dog watched the door."


def json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.fixture
def backend_pid(cpu_backend: BackendProcess) -> int:
    return cpu_backend.process.proc.pid


def assert_backend_up(cpu_backend: BackendProcess, pid: int) -> None:
    assert cpu_backend.process.alive(), cpu_backend.process.log_tail()
    assert cpu_backend.process.proc.pid == pid
    assert httpx.get(f"{cpu_backend.url}/health", timeout=10).status_code == 200


def test_a_summary_of_up_to_2000_characters_is_a_valid_json_answer(
    client: openai.OpenAI, cpu_backend: BackendProcess, backend_pid: int
) -> None:
    # Before, this request killed the CPU backend (SIGSEGV) on its first token.
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Summarize in one sentence: {ARTICLE}"}],
        response_format=json_schema_format(SUMMARY_SCHEMA),  # type: ignore[arg-type]
        max_tokens=700,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    answer = json.loads(choice.message.content or "")
    jsonschema.validate(answer, SUMMARY_SCHEMA)
    assert_backend_up(cpu_backend, backend_pid)


def post_chat(
    user: ApiUser, key: str, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 8, **body}
    if path.endswith("chat/completions"):
        body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    else:
        body.setdefault("prompt", "Hi")
    return user.http.post(path, json=body, headers={"Authorization": f"Bearer {key}"})


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 50_000}},
            "required": ["city"],
        },
    },
}


@pytest.mark.parametrize(
    ("body", "param", "reason"),
    [
        (
            {"response_format": json_schema_format(nested(40))},
            "response_format.json_schema.schema" + ".properties.a" * 32,
            "nested deeper than 64 levels",
        ),
        (
            {"response_format": json_schema_format({"type": "string", "minLength": 30_000_000})},
            "response_format.json_schema.schema.minLength",
            "limit of 10000",
        ),
        (
            {"response_format": json_schema_format({"type": "string", "pattern": "^(a{0,50}){0,50}$"})},
            "response_format.json_schema.schema.pattern",
            "multiply to 2500",
        ),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": "required"},
            "tools[0].function.parameters.properties.city.maxLength",
            "limit",
        ),
        ({"tools": [WEATHER_TOOL]}, "tools[0].function.parameters.properties.city.maxLength", "limit"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "deep", "parameters": nested(40)}}],
                "tool_choice": "none",
            },
            "tools[0].function.parameters" + ".properties.a" * 30,
            "nested deeper than 64 levels",
        ),
    ],
)
def test_a_schema_past_a_bound_is_a_400_naming_the_field(
    user: ApiUser,
    key: str,
    cpu_backend: BackendProcess,
    backend_pid: int,
    body: dict[str, Any],
    param: str,
    reason: str,
) -> None:
    response = post_chat(user, key, body)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["param"] == param
    assert error["code"] == "schema_out_of_bounds" and error["type"] == "invalid_request_error"
    assert reason in error["message"]
    assert_backend_up(cpu_backend, backend_pid)


def test_completions_bound_their_response_format_too(user: ApiUser, key: str) -> None:
    body = {"response_format": json_schema_format({"type": "string", "maxLength": 99_999})}
    response = post_chat(user, key, body, path="/v1/completions")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "response_format.json_schema.schema.maxLength"


def test_the_openai_sdk_sees_a_bad_request_naming_the_depth(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            response_format=json_schema_format(nested(40)),  # type: ignore[arg-type]
            max_tokens=5,
        )
    assert "nested deeper than 64 levels" in str(caught.value)
    # Deeper than any body may nest (128 levels, before the body is parsed): refused at the edge.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            response_format=json_schema_format(nested(200)),  # type: ignore[arg-type]
            max_tokens=5,
        )
    assert caught.value.code == "json_too_deep"
    assert "this server accepts 128" in str(caught.value)


def test_the_chat_api_refuses_them_with_its_own_error_shape(
    stack: Stack, cpu_backend: BackendProcess, backend_pid: int
) -> None:
    api = ChatApi(stack.url, "bounds-chat-user")
    chat_id = api.create_chat()
    prompter = api.prompter(chat_id, "Hi")
    prompter.raise_for_status()
    for schema, field in (
        (nested(40), "properties.a"),
        ({"type": "string", "maxLength": 20_000}, "maxLength"),
    ):
        response = api.assistant(
            chat_id,
            prompter.json()["id"],
            MODEL,
            response_format=json_schema_format(schema),
            max_new_tokens=5,
        )
        assert response.status_code == 400, response.text[:500]
        body = response.json()
        assert body["code"] == "schema_out_of_bounds"
        assert body["detail"].startswith(f"sampling_parameters.response_format.json_schema.schema.{field}")
    # Nothing was queued, and the same prompt is answered when asked within the bounds.
    answer = api.assistant(chat_id, prompter.json()["id"], MODEL, max_new_tokens=5)
    assert answer.status_code == 200, answer.text[:500]
    assert api.events(chat_id, answer.json()["id"])[-1].data["event_type"] == "message"
    assert_backend_up(cpu_backend, backend_pid)


def validation_errors(cpu_backend: BackendProcess) -> float:
    text = httpx.get(f"{cpu_backend.url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith('oasst_cpu_backend_requests_total{outcome="validation_error"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_schema_only_the_backend_refuses_fails_that_message_alone(
    embedded_stack: Stack, cpu_backend: BackendProcess, backend_pid: int
) -> None:
    # Within every bound, but no type the backend's converter knows: the backend answers 422, the worker
    # fails the message without a retry, and its other messages go on.
    api = ChatApi(embedded_stack.url, "bounds-refused-user")
    chat_id = api.create_chat()
    refused_before = validation_errors(cpu_backend)
    message_id, events = api.ask(
        chat_id, "Hi", MODEL, response_format=json_schema_format({"type": "strin"}), max_new_tokens=5
    )
    assert events[-1].data["event_type"] == "error"
    assert events[-1].data["message"]["state"] == "refused"  # the request's fault, not the server's
    assert "invalid JSON schema" in json.dumps(events[-1].data)
    assert not any(event.data["event_type"] == "retry" for event in events)
    assert validation_errors(cpu_backend) == refused_before + 1  # tried once, on one backend
    _, answered = api.ask(api.create_chat(), "Hello", MODEL, max_new_tokens=5)
    assert answered[-1].data["event_type"] == "message"
    assert_backend_up(cpu_backend, backend_pid)


def test_on_v1_a_schema_only_the_backend_refuses_is_a_400_not_a_server_error(
    client: openai.OpenAI, cpu_backend: BackendProcess, backend_pid: int
) -> None:
    unknown_type = json_schema_format({"type": "strin"})
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            response_format=unknown_type,  # type: ignore[arg-type]
            max_tokens=5,
        )
    assert caught.value.code == "request_refused_by_model"
    assert "invalid JSON schema" in str(caught.value)
    # Streamed, the headers are sent before the backend is asked: the error chunk names the caller's fault.
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        response_format=unknown_type,  # type: ignore[arg-type]
        max_tokens=5,
        stream=True,
    )
    with pytest.raises(openai.APIError) as streamed:
        list(stream)
    assert streamed.value.code == "request_refused_by_model"
    assert streamed.value.type == "invalid_request_error"
    assert_backend_up(cpu_backend, backend_pid)
