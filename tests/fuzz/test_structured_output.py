"""Fuzzing structured output through the real server, worker and CPU backend (SmolLM2): hypothesis draws
response formats and tool sets (nested objects and arrays, strings with length keywords and patterns,
enums, anyOf, $defs/$ref, numbers; counts on both sides of every bound) and sends them on ``/v1`` and on
the chat API. Every answer is a 2xx or a 4xx, never a 5xx; every answer the grammar constrained (a
finished response format, a forced tool call) is valid JSON of its schema; the backend process never
exits.

``make test`` runs a few dozen cases; ``OASST_FUZZ_EXAMPLES`` (as for the schemathesis fuzzing) runs more.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.chat_api import ChatApi
from tests.openai_api.conftest import ApiUser
from tests.support.json_schemas import object_schemas, schemas
from tests.support.stacks import BackendProcess, Stack, start_stack

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("OASST_FUZZ_EXAMPLES", "30"))
MODEL = "SmolLM2-135M-Instruct"
MAX_TOKENS = 40


@dataclass(frozen=True)
class ResponseFormatCase:
    schema: dict[str, Any]
    chat_api: bool


@dataclass(frozen=True)
class ToolsCase:
    parameters: list[dict[str, Any]]
    choice: str  # "auto", "required", or the index of the named tool


def cases() -> st.SearchStrategy[ResponseFormatCase | ToolsCase]:
    return st.one_of(
        st.builds(ResponseFormatCase, schemas(), st.booleans()),
        st.builds(
            ToolsCase,
            st.lists(object_schemas(max_leaves=4), min_size=1, max_size=3),
            st.sampled_from(["auto", "required", "0"]),
        ),
    )


@pytest.fixture(scope="module")
def fuzz_stack(cpu_backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of its own without rate or concurrency limits (the fuzzer sends many requests)."""
    log_dir: Path = tmp_path_factory.mktemp("schema-fuzz")
    stack = start_stack(
        log_dir,
        cpu_backend.url,
        f"sqlite+aiosqlite:///{log_dir}/oasst.db",
        None,
        OASST_SERVER_RATE_LIMIT_PER_MINUTE="0",
        OASST_SERVER_MAX_CONCURRENT_GENERATIONS_PER_USER="0",
    )
    yield stack
    stack.stop()
    log = stack.server.log_path.read_text(errors="replace")
    assert "unhandled error" not in log and "Traceback" not in log, stack.server.log_tail(120)


def validate(instance: Any, schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(schema).validate(instance)


def ask_v1(user: ApiUser, key: str, body: dict[str, Any]) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        **body,
    }
    return user.http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def assert_not_a_server_error(response: httpx.Response, case: object) -> None:
    assert response.status_code < 500, f"{response.status_code} {response.text[:1000]} for {case!r}"[:3000]
    if response.status_code >= 400:
        assert response.status_code in (400, 422), response.text[:500]


def run_response_format(
    user: ApiUser, key: str, api: ChatApi, chat_id: str, case: ResponseFormatCase
) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": case.schema}}
    if not case.chat_api:
        response = ask_v1(user, key, {"response_format": response_format})
        assert_not_a_server_error(response, case)
        if response.status_code == 200:
            choice = response.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                validate(json.loads(choice["message"]["content"]), case.schema)
        return
    prompter = api.prompter(chat_id, "Answer in JSON.")
    assert prompter.status_code < 300, prompter.text
    answer = api.assistant(
        chat_id, prompter.json()["id"], MODEL, response_format=response_format, max_new_tokens=MAX_TOKENS
    )
    assert_not_a_server_error(answer, case)
    if answer.status_code >= 300:
        return
    final = api.events(chat_id, answer.json()["id"])[-1].data
    assert final["event_type"] == "message", f"{final} for {case!r}"
    message = final["message"]
    if message["finish_reason"] in ("stop", "eos_token"):
        validate(json.loads(message["content"]), case.schema)


def run_tools(user: ApiUser, key: str, case: ToolsCase) -> None:
    tools = [
        {"type": "function", "function": {"name": f"tool_{index}", "parameters": parameters}}
        for index, parameters in enumerate(case.parameters)
    ]
    choice: Any = case.choice
    if choice.isdigit():
        choice = {"type": "function", "function": {"name": f"tool_{choice}"}}
    response = ask_v1(user, key, {"tools": tools, "tool_choice": choice})
    assert_not_a_server_error(response, case)
    if response.status_code != 200 or case.choice == "auto":
        return  # "auto" answers are not constrained
    message = response.json()["choices"][0]["message"]
    for call in message.get("tool_calls") or []:
        index = int(call["function"]["name"].removeprefix("tool_"))
        validate(json.loads(call["function"]["arguments"]), case.parameters[index])


@pytest.mark.timeout(max(300, 20 * EXAMPLES))
def test_structured_output_never_fails_the_server_or_the_backend(
    fuzz_stack: Stack, cpu_backend: BackendProcess
) -> None:
    pid = cpu_backend.process.proc.pid
    user = ApiUser(fuzz_stack.url, "schema-fuzzer")
    key = str(user.create_key()["key"])
    api = ChatApi(fuzz_stack.url, "schema-fuzzer-chat")
    chat_id = api.create_chat()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(case=cases())
    def one(case: ResponseFormatCase | ToolsCase) -> None:
        if isinstance(case, ResponseFormatCase):
            run_response_format(user, key, api, api.create_chat() if case.chat_api else chat_id, case)
        else:
            run_tools(user, key, case)
        assert cpu_backend.process.alive(), cpu_backend.process.log_tail()

    one()
    assert cpu_backend.process.alive() and cpu_backend.process.proc.pid == pid
    assert httpx.get(f"{cpu_backend.url}/health", timeout=10).status_code == 200
