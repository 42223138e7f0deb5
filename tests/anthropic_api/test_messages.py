"""The Anthropic Messages API driven by the official ``anthropic`` SDK, against the real stacks.

Each test runs on the embedded default (SQLite, in-process broker) and on Postgres + Redis, with the
real CPU backend serving SmolLM2. Greedy output differs between llama.cpp builds, so the tests check
properties (token counts, stop reasons, equality within a run), not fixed text.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.anthropic_api.conftest import anthropic_client
from tests.openai_api.conftest import ApiUser

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
# The SDK's create() no longer names temperature; the API and older clients still send it.
GREEDY = {"temperature": 0}
QUESTION: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city"}},
        "required": ["city"],
    },
}


def test_create_answers_with_a_message_and_its_usage(client: anthropic.Anthropic, user: ApiUser) -> None:
    message = client.messages.create(
        model=MODEL, max_tokens=16, extra_body=GREEDY, system="You answer briefly.", messages=QUESTION
    )
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_") and message._request_id == message.id
    assert len(message.content) == 1 and message.content[0].type == "text"
    assert message.content[0].text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 16
    # The same usage record as every other API's request.
    record = user.wait_finished(message.id)
    assert record["state"] == "complete" and record["id"] == message.id.removeprefix("msg_")
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        message.usage.input_tokens,
        message.usage.output_tokens,
    )


def test_max_tokens_ends_the_answer_with_max_tokens(client: anthropic.Anthropic) -> None:
    message = client.messages.create(
        model=MODEL,
        max_tokens=3,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Count from 1 to 100, separated by commas."}],
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3


def test_streamed_deltas_make_the_final_message_and_the_answer_create_gives(
    client: anthropic.Anthropic,
) -> None:
    asked: dict[str, Any] = {"model": MODEL, "max_tokens": 24, "extra_body": GREEDY, "messages": QUESTION}
    whole = client.messages.create(**asked)
    with client.messages.stream(**asked) as stream:
        deltas = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(deltas) > 1 and "".join(deltas) == final.content[0].text  # type: ignore[union-attr]
    assert final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.id.startswith("msg_") and final.id != whole.id
    assert final.stop_reason == whole.stop_reason
    assert (final.usage.input_tokens, final.usage.output_tokens) == (
        whole.usage.input_tokens,
        whole.usage.output_tokens,
    )


def test_raw_stream_events_come_in_anthropics_order(client: anthropic.Anthropic) -> None:
    events = list(
        client.messages.create(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=QUESTION, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    start = events[0].message  # type: ignore[union-attr]
    assert start.content == [] and start.stop_reason is None and start.id.startswith("msg_")
    assert events[1].content_block.type == "text" and events[1].index == 0  # type: ignore[union-attr]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")  # type: ignore[union-attr]
    assert text.strip()
    delta = events[-2]
    assert delta.delta.stop_reason in ("end_turn", "max_tokens")  # type: ignore[union-attr]
    assert delta.usage.output_tokens > 0 and delta.usage.input_tokens  # type: ignore[union-attr]


def test_a_tool_round_trip(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.messages.create(
        model=MODEL,
        max_tokens=64,
        extra_body=GREEDY,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=messages,
    )
    assert called.stop_reason == "tool_use"
    (use,) = [block for block in called.content if block.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    assert isinstance(use.input, dict) and isinstance(use.input.get("city"), str)
    messages += [
        {"role": "assistant", "content": called.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 degrees Celsius."}
            ],
        },
    ]
    final = client.messages.create(
        model=MODEL, max_tokens=32, extra_body=GREEDY, tools=[WEATHER_TOOL], messages=messages
    )
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.content[0].type == "text" and final.content[0].text.strip()


def test_a_streamed_tool_call_arrives_as_input_json_deltas(client: anthropic.Anthropic) -> None:
    asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 64,
        "extra_body": GREEDY,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "What is the weather in Rome?"}],
    }
    whole = client.messages.create(**asked)
    with client.messages.stream(**asked) as stream:
        partial = [e.partial_json for e in stream if e.type == "input_json"]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and partial
    use = final.content[-1]
    assert use.type == "tool_use" and json.loads("".join(partial)) == use.input
    assert use.input == whole.content[-1].input  # type: ignore[union-attr]


def test_stop_sequences_end_the_answer_before_them(client: anthropic.Anthropic) -> None:
    asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 40,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
    }
    free = client.messages.create(**asked).content[0].text  # type: ignore[union-attr]
    words = free.split()
    assert len(words) >= 4, free
    stop = f" {words[2]}"
    message = client.messages.create(**asked, stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == free[: free.index(stop)]  # type: ignore[union-attr]


def test_an_output_format_makes_the_answer_json_of_its_schema(client: anthropic.Anthropic) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    message = client.messages.create(
        model=MODEL,
        max_tokens=80,
        extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        messages=[{"role": "user", "content": "Name a city and its country."}],
    )
    answer = json.loads(message.content[0].text)  # type: ignore[union-attr]
    assert set(answer) == {"city", "country"} and all(isinstance(v, str) for v in answer.values())


def test_count_tokens_counts_what_the_model_reads(client: anthropic.Anthropic) -> None:
    asked: dict[str, Any] = {"model": MODEL, "system": "You answer briefly.", "messages": QUESTION}
    counted = client.messages.count_tokens(**asked)
    answered = client.messages.create(**asked, max_tokens=4, extra_body=GREEDY)
    assert counted.input_tokens == answered.usage.input_tokens > 0
    with_tools = client.messages.count_tokens(**asked, tools=[WEATHER_TOOL])  # type: ignore[list-item]
    assert with_tools.input_tokens > counted.input_tokens


def test_the_claude_code_environment_reaches_the_server(
    user: ApiUser, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", user.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    with anthropic.Anthropic(max_retries=0) as client:
        message = client.messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    assert message.usage.output_tokens > 0
    # A bearer token works as well (ANTHROPIC_AUTH_TOKEN).
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with anthropic.Anthropic(auth_token=key, max_retries=0) as client:
        assert client.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens > 0


def test_a_request_shaped_like_claude_codes_streams(client: anthropic.Anthropic) -> None:
    """What Claude Code sends besides the basics: beta headers and query, cache_control everywhere,
    metadata, thinking settings; accepted, and the answer streams."""
    ephemeral: Any = {"type": "ephemeral"}
    events = client.messages.create(
        model=MODEL,
        max_tokens=16,
        stream=True,
        system=[{"type": "text", "text": "You are a helpful coding assistant.", "cache_control": ephemeral}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Say hello.", "cache_control": ephemeral}],
            }
        ],
        tools=[{**WEATHER_TOOL, "cache_control": ephemeral}],
        metadata={"user_id": "user_0123abcd_account__session_4567-89ab"},
        thinking={"type": "disabled"},
        cache_control=ephemeral,
        extra_headers={
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
            "x-app": "cli",
        },
        extra_query={"beta": "true"},
        extra_body=GREEDY,
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]


# ---------------------------------------------------------------- errors, as the SDK sees them


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["type"])


def test_errors_have_anthropics_shape_and_status(user: ApiUser, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.AuthenticationError) as bad_key:
        anthropic_client(user, "oak-not-a-key").messages.create(model=MODEL, max_tokens=4, messages=QUESTION)
    assert _error_type(bad_key.value) == "authentication_error"

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as bad_request:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert _error_type(bad_request.value) == "invalid_request_error"
    assert "image blocks are not supported" in bad_request.value.message

    with pytest.raises(anthropic.BadRequestError) as missing:
        # The SDK's own low-level call: create() itself refuses to send a request without max_tokens.
        client.post("/v1/messages", body={"model": MODEL, "messages": QUESTION}, cast_to=object)
    assert "max_tokens" in missing.value.message

    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="no-such-model", max_tokens=4, messages=QUESTION)
    assert _error_type(unknown.value) == "not_found_error" and MODEL in unknown.value.message

    huge = [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]
    with pytest.raises(anthropic.ContentTooLargeError) as too_large:
        client.messages.create(model=MODEL, max_tokens=4, messages=huge)
    assert too_large.value.status_code == 413 and _error_type(too_large.value) == "invalid_request_error"

    too_long = [{"role": "user", "content": "hello " * 2_600}]  # within the message bound, over the context
    with pytest.raises(anthropic.BadRequestError) as context:
        client.messages.create(model=MODEL, max_tokens=4, messages=too_long)
    assert "maximum input length" in context.value.message


def test_the_openai_routes_keep_their_shape(user: ApiUser) -> None:
    response = user.http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": QUESTION},
        headers={"Authorization": "Bearer oak-not-a-key"},
    )
    assert response.status_code == 401 and set(response.json()) == {"error"}
    assert response.json()["error"]["type"] == "authentication_error"


def test_the_rate_limit_is_a_rate_limit_error(limited_stack: Any) -> None:
    user = ApiUser(limited_stack.url, "ant-limited")
    client = anthropic_client(user, str(user.create_key()["key"]))
    for _ in range(3):
        client.messages.create(model=MODEL, max_tokens=2, messages=QUESTION)
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model=MODEL, max_tokens=2, messages=QUESTION)
    assert _error_type(limited.value) == "rate_limit_error"
    assert int(limited.value.response.headers["retry-after"]) > 0
    # count_tokens is no generation: the limit does not refuse it.
    assert client.messages.count_tokens(model=MODEL, messages=QUESTION).input_tokens > 0
