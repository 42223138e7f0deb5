"""The Responses API (``/v1/responses``) driven by the unmodified ``openai`` SDK on the real model.

Plain, streamed (typed events whose deltas make the final text), a function tool round trip (by
``previous_response_id`` and by items), ``text.format`` with a JSON schema, background runs retrieved
until done and their streams resumed with ``starting_after``, cancel, delete, input items, and the 4xx
answers to bad input. Answers are checked for properties, not fixed text.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.openai_api.conftest import ApiUser, new_user
from tests.support.stacks import MODEL_NAME, Stack
from tests.support.tcp_cutting_proxy import CuttingProxy

pytestmark = pytest.mark.slow

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 30},
        "age": {"type": "integer"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(params=["production"])
def stack(request: pytest.FixtureRequest) -> Stack:
    # Postgres and Redis: the stream a resume reads is the broker's (the embedded stack runs the
    # same code on the in-process broker; test_plain_response covers it too).
    return request.getfixturevalue(f"{request.param}_stack")  # type: ignore[no-any-return]


def _events(stream: Any) -> list[Any]:
    return list(stream)


def _deltas(events: list[Any]) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


@pytest.mark.parametrize("stack_name", ["embedded", "production"])
def test_plain_response(request: pytest.FixtureRequest, stack_name: str) -> None:
    user = new_user(request.getfixturevalue(f"{stack_name}_stack"))
    client = user.client(user.create_key()["key"])
    response = client.responses.create(
        model=MODEL_NAME,
        input="Name a colour.",
        instructions="Answer in one word.",
        max_output_tokens=12,
        temperature=0,
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.instructions == "Answer in one word." and response.store is True
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    again = client.responses.retrieve(response.id)
    assert again.output_text == response.output_text and again.status == response.status
    # The usage record of the /v1 API, as for a chat completion.
    record = user.request_record(response.id)
    assert record["kind"] == "response" and record["prompt_tokens"] == usage.input_tokens
    assert record["completion_tokens"] == usage.output_tokens


def test_a_streamed_response_has_the_typed_events_and_its_deltas_make_the_text(client: openai.OpenAI) -> None:
    events = _events(
        client.responses.create(
            model=MODEL_NAME,
            input="Count from one to five.",
            max_output_tokens=24,
            stream=True,
            temperature=0,
        )
    )
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert _deltas(events) == events[-4].text == final.output_text != ""
    assert final.usage.output_tokens > 0
    assert client.responses.retrieve(final.id).output_text == final.output_text
    unstreamed = client.responses.create(
        model=MODEL_NAME, input="Count from one to five.", max_output_tokens=24, temperature=0
    )
    assert unstreamed.output_text == final.output_text  # greedy: the same answer either way


def _forced_call(client: openai.OpenAI) -> Any:
    response = client.responses.create(
        model=MODEL_NAME,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert set(json.loads(calls[0].arguments)) == {"city"}
    return response, calls[0]


def test_a_function_tool_round_trip_with_previous_response_id(client: openai.OpenAI) -> None:
    first, call = _forced_call(client)
    second = client.responses.create(
        model=MODEL_NAME,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 degrees."}],
        tools=[WEATHER_TOOL],
        max_output_tokens=32,
        temperature=0,
    )
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    assert second.output_text
    # The conversation continued from the first: its prompt held the first's input and call.
    assert second.usage.input_tokens > first.usage.input_tokens


def test_a_function_tool_round_trip_with_items(client: openai.OpenAI) -> None:
    _, call = _forced_call(client)
    answer = client.responses.create(
        model=MODEL_NAME,
        store=False,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 degrees."},
        ],
        tools=[WEATHER_TOOL],
        max_output_tokens=32,
        temperature=0,
    )
    assert answer.output_text and answer.store is False
    with pytest.raises(openai.NotFoundError):  # not stored: not retrievable
        client.responses.retrieve(answer.id)


def test_a_json_schema_answer_parses_and_validates(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_NAME,
        input="Invent a person.",
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA, "strict": True}},
        max_output_tokens=64,
        temperature=0,
    )
    jsonschema.validate(json.loads(response.output_text), PERSON_SCHEMA)
    assert response.text.format.type == "json_schema"


def _wait_done(client: openai.OpenAI, response_id: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        response = client.responses.retrieve(response_id)
        seen.append(response.status)
        if response.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return response, seen
        time.sleep(0.1)


def test_background_response_retrieved_until_done_and_its_stream_resumed(client: openai.OpenAI) -> None:
    created = client.responses.create(
        model=MODEL_NAME, input="Tell me about the sea.", background=True, max_output_tokens=40, temperature=0
    )
    assert created.background is True and created.status in ("queued", "in_progress")
    done, seen = _wait_done(client, created.id)
    assert done.status in ("completed", "incomplete") and done.output_text and seen[-1] == done.status
    full = _events(client.responses.retrieve(created.id, stream=True))
    assert [e.sequence_number for e in full] == list(range(len(full)))
    assert _deltas(full) == done.output_text
    for cut in (0, 3, len(full) // 2, len(full) - 2):
        rest = _events(client.responses.retrieve(created.id, stream=True, starting_after=cut))
        assert [e.sequence_number for e in rest] == list(range(cut + 1, len(full)))
        assert _deltas(full[: cut + 1]) + _deltas(rest) == done.output_text


def test_a_background_stream_can_be_resumed_while_it_runs(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL_NAME,
        input="Describe a forest.",
        background=True,
        stream=True,
        max_output_tokens=60,
        temperature=0,
    )
    first = []
    for event in stream:
        first.append(event)
        if event.type == "response.output_text.delta" and len(first) >= 6:
            break
    stream.close()  # the client leaves: a background response goes on
    rest = _events(
        client.responses.retrieve(first[0].response.id, stream=True, starting_after=first[-1].sequence_number)
    )
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert _deltas(events) == events[-1].response.output_text


def test_cancel_a_background_response(client: openai.OpenAI) -> None:
    created = client.responses.create(
        model=MODEL_NAME,
        input="Write a very long story.",
        background=True,
        max_output_tokens=2000,
        temperature=0,
    )
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(created.id).status == "cancelled"
    events = _events(client.responses.retrieve(created.id, stream=True))
    assert events[-1].type == "response.failed" and events[-1].response.status == "cancelled"


def test_only_background_responses_can_be_cancelled(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(response.id)


def test_delete_a_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=4)
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL_NAME, input="Hi", previous_response_id=response.id)


def test_input_items_are_listed(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL_NAME,
        input=[
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi! How can I help?"},
            {"role": "user", "content": [{"type": "input_text", "text": "Say bye."}]},
        ],
        max_output_tokens=4,
    )
    items = client.responses.input_items.list(response.id)
    assert [i.content[0].text for i in items.data] == ["Say bye.", "Hi! How can I help?", "Hello"]
    assert [i.role for i in items.data] == ["user", "assistant", "user"]
    ascending = client.responses.input_items.list(response.id, order="asc", limit=2)
    assert [i.content[0].text for i in ascending.data] == ["Hello", "Hi! How can I help?"]
    assert ascending.has_more is True


def test_another_users_response_is_not_found(stack: Stack, client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=4, background=True)
    other = new_user(stack)
    stranger = other.client(other.create_key()["key"])
    for call in (
        lambda: stranger.responses.retrieve(response.id),
        lambda: stranger.responses.cancel(response.id),
        lambda: stranger.responses.delete(response.id),
        lambda: stranger.responses.input_items.list(response.id),
        lambda: list(stranger.responses.retrieve(response.id, stream=True)),
        lambda: stranger.responses.create(model=MODEL_NAME, input="Hi", previous_response_id=response.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    _wait_done(client, response.id)
    assert client.responses.retrieve(response.id).status in ("completed", "incomplete")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "no-such-model", "input": "Hi"}, 404, "model"),
        ({"input": [{"role": "user", "content": "x"}] * 300}, 400, "input"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, 400, "tools"),
        ({"input": "Hi", "background": True, "store": False}, 400, None),
        ({"input": "Hi", "previous_response_id": "resp_nonexistent"}, 404, "previous_response_id"),
        ({"input": "Hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, 400, "input"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, 400, "text"),
        # A keyword the bundled backend's grammar does not enforce: named in the Responses API's terms.
        (
            {
                "input": "Hi",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "n",
                        "schema": {"type": "integer", "minimum": 1},
                    }
                },
            },
            400,
            "text.format",
        ),
    ],
)
def test_bad_requests_get_openai_errors(
    user: ApiUser, key: str, body: dict, status: int, param: str | None
) -> None:
    response = user.http.post(
        "/v1/responses", json={"model": MODEL_NAME, **body}, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["code"]
    if param is not None:
        assert (error["param"] or "").startswith(param), error


def test_bad_ids_get_4xx(user: ApiUser, key: str) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    assert user.http.get("/v1/responses/" + "r" * 200, headers=auth).status_code == 400
    assert user.http.get("/v1/responses/resp_abc", headers=auth).status_code == 404
    assert user.http.get("/v1/responses/not-a-response-id", headers=auth).status_code == 404
    bad = user.http.get(
        "/v1/responses/resp_abc", params={"stream": "true", "starting_after": "-5"}, headers=auth
    )
    assert bad.status_code == 400
    assert (
        user.http.get("/v1/responses/resp_abc/input_items", params={"limit": 1000}, headers=auth).status_code
        == 400
    )
    assert httpx.get(f"{user.base_url}/v1/responses/resp_abc").status_code == 401


def _read_until_cut(stream: Any) -> list[Any]:
    """The events a stream delivered before its connection dropped (the drop is expected)."""
    events: list[Any] = []
    with pytest.raises((httpx.HTTPError, openai.APIError)):
        for event in stream:
            events.append(event)
    return events


def test_a_stream_cut_by_the_network_resumes_with_no_gap_and_no_duplicate(
    stack: Stack, user: ApiUser, key: str
) -> None:
    with CuttingProxy(stack.url, b"event: response.output_text.delta", count=5) as proxy:
        through_proxy = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0, timeout=120)
        stream = through_proxy.responses.create(
            model=MODEL_NAME, input="Describe a city at night.", background=True, stream=True,
            max_output_tokens=80, temperature=0,
        )  # fmt: skip
        first = _read_until_cut(stream)
        assert proxy.cut.is_set()
    assert first and first[-1].type != "response.completed"
    response_id = first[0].response.id
    rest = _events(
        user.client(key).responses.retrieve(
            response_id, stream=True, starting_after=first[-1].sequence_number
        )
    )
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert (
        _deltas(events)
        == events[-1].response.output_text
        == user.client(key).responses.retrieve(response_id).output_text
    )


def test_resumed_streams_count_as_event_stream_readers(
    client: openai.OpenAI, user: ApiUser, key: str
) -> None:
    """A response's streams are bounded as the chat API's are: 8 readers per message by default."""
    created = client.responses.create(
        model=MODEL_NAME,
        input="Count from 1 to 2000, separated by commas.",
        background=True,
        max_output_tokens=3000,
        temperature=0,
    )
    url = f"/v1/responses/{created.id}"
    auth = {"Authorization": f"Bearer {key}"}
    with contextlib.ExitStack() as open_streams:
        # Each reader's line iterator is kept: one dropped is closed at once, and its connection with it.
        readers = []
        for _ in range(8):
            reader = open_streams.enter_context(
                user.http.stream("GET", url, params={"stream": "true"}, headers=auth)
            )
            assert reader.status_code == 200
            readers.append(reader.iter_lines())
            next(readers[-1])  # its first event: the slot is held
        assert client.responses.retrieve(created.id).status == "in_progress"  # the readers still read
        refused = user.http.get(url, params={"stream": "true"}, headers=auth)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_readers"
        assert refused.headers["Retry-After"]
    client.responses.cancel(created.id)
