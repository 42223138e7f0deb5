"""The Anthropic Messages API without a server: requests into the internal request, answers into
messages and stream events, and errors into Anthropic's shape and statuses."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from oasst_inference_server.anthropic_api.anthropic_streams import closing_events, error_event
from oasst_inference_server.anthropic_api.conversion import stop_reason, to_internal, to_message
from oasst_inference_server.anthropic_api.errors import error_body
from oasst_inference_server.anthropic_api.schemas import CountTokensRequest, MessagesRequest
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_shared.schemas import MessageRead, MessageState, Role
from oasst_shared.tool_calls import ToolCall, ToolCallFunction

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    return MessagesRequest.model_validate(body)


def answer(
    content: str = "",
    finish: str | None = "eos_token",
    calls: list[ToolCall] | None = None,
    generated: int = 3,
) -> MessageRead:
    return MessageRead(
        id="abc",
        chat_id=None,
        parent_id=None,
        content=content,
        created_at=datetime.now(UTC),
        role=Role.assistant,
        state=MessageState.complete,
        finish_reason=finish,
        prompt_tokens=7,
        generated_tokens=generated,
        tool_calls=calls,
    )


def test_a_tool_round_trip_becomes_system_user_assistant_call_and_tool_turns() -> None:
    internal = to_internal(
        request(
            system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
            tools=[WEATHER],
            tool_choice={"type": "auto"},
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me look."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {"type": "text", "text": "And now?"},
                    ],
                },
            ],
        )
    )
    system, thread = internal.to_thread()
    assert system == "Be brief.\n\nUse tools."
    assert [t.role for t in thread] == ["user", "assistant", "tool", "user"]
    call = thread[1].tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "toolu_1",
        "get_weather",
        {"city": "Paris"},
    )
    assert thread[1].content == "Let me look."
    assert (thread[2].tool_call_id, thread[2].content, thread[3].content) == ("toolu_1", "sunny", "And now?")
    assert internal.tools[0].function.parameters == WEATHER["input_schema"]  # type: ignore[index]
    assert internal.tool_choice == "auto" and internal.max_tokens == 16


@pytest.mark.parametrize(
    ("choice", "internal"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
    ],
)
def test_tool_choices_map_to_openai_choices(choice: dict[str, Any], internal: str) -> None:
    assert to_internal(request(tools=[WEATHER], tool_choice=choice)).tool_choice == internal


def test_a_named_tool_choice_forces_that_function() -> None:
    choice = to_internal(
        request(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    ).tool_choice
    assert choice.function.name == "get_weather"  # type: ignore[union-attr]


def test_an_error_result_says_so_and_sampling_fields_carry_over() -> None:
    internal = to_internal(
        request(
            temperature=0,
            top_p=0.5,
            top_k=5,
            stop_sequences=["END"],
            metadata={"user_id": "u1"},
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "is_error": True,
                            "content": [{"type": "text", "text": "boom"}],
                        }
                    ],
                },
            ],
        )
    )
    _, thread = internal.to_thread()
    assert thread[-1].role == "tool" and thread[-1].content == "Error: boom"
    sampling = internal.to_sampling_parameters(default_max_tokens=100)
    assert sampling.do_sample is False and sampling.stop == ["END"] and sampling.max_new_tokens == 16
    assert internal.user == "u1"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image blocks"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "last message",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
            "no earlier tool_use",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"tools": [{**WEATHER, "name": "bad name"}]}, "function name"),
        ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]}, "not among the tools"),
        ({"tool_choice": {"type": "any"}}, "needs tools"),
        ({"stop_sequences": ["a"] * 5}, "at most 4"),
        ({"stop_sequences": [""]}, "stop sequence"),
        ({"max_tokens": 0}, "greater than or equal to 1"),
        ({"temperature": 1.5}, "less than or equal to 1"),
        ({"messages": []}, "at least 1"),
        ({"messages": [{"role": "system", "content": "s"}]}, "'user' or 'assistant'"),
        ({"mcp_servers": [{"url": "x"}]}, "MCP"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 1025}]}, "at most 1024"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_it(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**fields)
    assert says in str(caught.value)


def test_an_output_format_becomes_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    output = {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}
    sampling = to_internal(request(output_config=output)).to_sampling_parameters(default_max_tokens=100)
    assert sampling.output_schema == schema


def test_a_count_needs_no_max_tokens_and_converts_the_same() -> None:
    count = CountTokensRequest.model_validate(
        {"model": "m", "system": "s", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    )
    system, thread = to_internal(count).to_thread()
    assert system == "s" and [t.content for t in thread] == ["hi"]


def test_internal_bounds_are_refused_as_invalid_requests() -> None:
    # A tool description past the internal bound is caught by the Anthropic schema; a stop sequence
    # list is too; what only the internal request knows comes back as InvalidRequest.
    body = request()
    body.messages[0].content = "x"
    body.model = ""
    with pytest.raises(InvalidRequest):
        to_internal(body)


@pytest.mark.parametrize(
    ("final", "stops", "reason", "sequence"),
    [
        (answer("hi"), None, "end_turn", None),
        (answer("hi", "length"), None, "max_tokens", None),
        (answer("hi", "length", generated=2), None, "model_context_window_exceeded", None),
        (answer("hi", "stop_sequence"), ["END"], "stop_sequence", "END"),
        (answer("hi", "stop_sequence"), ["A", "B"], "stop_sequence", None),
        (answer("hi", "stop_sequence"), None, "end_turn", None),
        (
            answer("", calls=[ToolCall(id="call_1", function=ToolCallFunction(name="f", arguments="{}"))]),
            None,
            "tool_use",
            None,
        ),
    ],
)
def test_stop_reasons(final: MessageRead, stops: list[str] | None, reason: str, sequence: str | None) -> None:
    assert stop_reason(final, stops, max_tokens=3) == (reason, sequence)


def test_an_answer_becomes_a_message_with_text_and_tool_use_blocks() -> None:
    call = ToolCall(id="call_9", function=ToolCallFunction(name="get_weather", arguments='{"city": "Oslo"}'))
    message = to_message(answer("", calls=[call]), "m", request()).model_dump()
    assert message["id"] == "msg_abc" and message["type"] == "message" and message["role"] == "assistant"
    assert message["content"] == [
        {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo"}}
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 7 and message["usage"]["output_tokens"] == 3
    plain = to_message(answer(""), "m", request()).model_dump()
    assert plain["content"] == [{"type": "text", "text": ""}] and plain["stop_reason"] == "end_turn"


def _events(stream: list[str]) -> list[tuple[str, dict[str, Any]]]:
    parsed = []
    for item in "".join(stream).split("\n\n"):
        if item:
            head, data = item.split("\n")
            assert head.startswith("event: ") and data.startswith("data: ")
            payload = json.loads(data.removeprefix("data: "))
            assert payload["type"] == head.removeprefix("event: ")
            parsed.append((payload["type"], payload))
    return parsed


def test_closing_events_of_a_tool_call_carry_its_input_in_fragments() -> None:
    arguments = json.dumps({"city": "São Paulo, a long name to need several fragments", "days": 3})
    call = ToolCall(id="call_2", function=ToolCallFunction(name="get_weather", arguments=arguments))
    events = _events(closing_events(answer("", calls=[call]), text_open=False, request=request()))
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "content_block_start" and kinds[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]
    assert start["index"] == 0
    assert start["content_block"] == {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}}
    fragments = [p["delta"]["partial_json"] for k, p in events if k == "content_block_delta"]
    assert len(fragments) > 1 and json.loads("".join(fragments)) == json.loads(arguments)
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 7, "output_tokens": 3}


def test_closing_events_close_an_open_text_block_or_send_an_empty_one() -> None:
    after_text = [k for k, _ in _events(closing_events(answer("hi"), text_open=True, request=request()))]
    assert after_text == ["content_block_stop", "message_delta", "message_stop"]
    empty = _events(closing_events(answer(""), text_open=False, request=request()))
    assert [k for k, _ in empty] == [
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert empty[0][1]["content_block"] == {"type": "text", "text": ""}


@pytest.mark.parametrize(
    ("status", "anthropic_status", "kind"),
    [
        (400, 400, "invalid_request_error"),
        (422, 400, "invalid_request_error"),
        (401, 401, "authentication_error"),
        (403, 403, "permission_error"),
        (404, 404, "not_found_error"),
        (409, 409, "invalid_request_error"),
        (413, 413, "invalid_request_error"),
        (429, 429, "rate_limit_error"),
        (500, 500, "api_error"),
        (502, 502, "api_error"),
        (503, 529, "overloaded_error"),
    ],
)
def test_errors_take_anthropic_statuses_and_types(status: int, anthropic_status: int, kind: str) -> None:
    got, body = error_body(status, "why")
    assert got == anthropic_status
    dumped = body.model_dump()
    assert dumped["type"] == "error" and dumped["error"] == {"type": kind, "message": "why"}
    assert dumped["request_id"].startswith("req_")


def test_a_failure_in_a_stream_is_an_error_event_in_anthropics_shape() -> None:
    ((kind, payload),) = _events([error_event(500, "the generation failed: boom")])
    assert kind == "error"
    assert payload["error"] == {"type": "api_error", "message": "the generation failed: boom"}
    assert payload["request_id"].startswith("req_")
