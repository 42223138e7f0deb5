"""The Responses API's pure pieces: the request's conversion to chat messages, its bounds, the
response ids, and the numbered event sequence (the same for every reader, which resuming needs)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from oasst_inference_server.responses_api.event_sequence import ResponseEventSequence, render
from oasst_inference_server.responses_api.objects import (
    StoredRequest,
    message_id_of,
    response_id,
    response_object,
)
from oasst_inference_server.responses_api.wire import (
    MAX_INPUT_ITEMS,
    ResponsesRequest,
    chat_messages_of,
)
from oasst_shared.schemas import MessageRead, MessageState
from oasst_shared.tool_calls import ToolCall, ToolCallFunction

MESSAGE_ID = "0b6f4c1e-7d2a-4a39-9d6e-3c1f7e9a2b10"


def _final(
    content: str | None, calls: list[ToolCall] | None = None, finish: str = "eos_token"
) -> MessageRead:
    return MessageRead(
        id=MESSAGE_ID,
        chat_id=None,
        parent_id=None,
        content=content,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        role="assistant",
        state=MessageState.complete,
        finish_reason=finish,
        prompt_tokens=7,
        generated_tokens=3,
        tool_calls=calls,
    )


def _sequence() -> ResponseEventSequence:
    stored = StoredRequest()

    def snapshot(status, output, final):  # type: ignore[no-untyped-def]
        return response_object(final or _final(None), "m", stored, status=status, output=output)

    return ResponseEventSequence(MESSAGE_ID, snapshot)


def test_items_become_chat_messages_with_calls_joined_to_the_assistant_turn() -> None:
    body = ResponsesRequest.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "weather?"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "let me"}],
                },
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
        }
    )
    messages = chat_messages_of(body.items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "let me" and messages[1]["tool_calls"][0]["id"] == "c1"
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


@pytest.mark.parametrize(
    "body",
    [
        {"input": [{"type": "image_generation_call"}]},
        {"input": []},
        {"input": ""},
        {"input": [{"role": "user", "content": "x"}] * (MAX_INPUT_ITEMS + 1)},
        {"input": "x", "tools": [{"type": "web_search"}]},
        {"input": "x", "background": True, "store": False},
        {"input": "x", "conversation": "conv_1"},
        {"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}},
        {"input": [{"type": "function_call", "call_id": "c" * 257, "name": "f", "arguments": "{}"}]},
        {"input": [{"role": "user", "content": "x", "id": "bad id"}]},
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}] * 65}]},
        {
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "output_text", "text": "x"}] * 65,
                },
            ]
        },
    ],
)
def test_requests_past_a_bound_or_unsupported_are_refused(body: dict) -> None:
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate({"model": "m", **body})


def test_an_empty_reasoning_option_is_accepted() -> None:
    ResponsesRequest.model_validate({"model": "m", "input": "x", "reasoning": {"effort": None}})


def test_response_ids_round_trip_and_foreign_ids_are_none() -> None:
    assert message_id_of(response_id(MESSAGE_ID)) == MESSAGE_ID
    assert message_id_of("chatcmpl-1") is None
    assert message_id_of("resp_" + "a" * 65) is None
    assert message_id_of("resp_../x") is None


def test_the_event_sequence_is_numbered_and_its_deltas_make_the_text() -> None:
    sequence = _sequence()
    events = sequence.opening()
    for token in ["Hel", "lo", "", " world"]:
        events += sequence.text(token)
    events += sequence.finish(_final("Hello world"))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "Hello world" == events[-4]["text"]
    completed = events[-1]["response"]
    assert completed["status"] == "completed" and completed["output"][0]["content"][0]["text"] == deltas
    assert completed["usage"] == {
        "input_tokens": 7,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 10,
    }


def test_a_function_call_answer_streams_its_arguments() -> None:
    call = ToolCall(
        id="call_1", function=ToolCallFunction(name="get_weather", arguments='{"city": "' + "x" * 40 + '"}')
    )
    sequence = _sequence()
    events = sequence.opening() + sequence.finish(_final(None, [call]))
    types = [e["type"] for e in events]
    assert "response.output_text.delta" not in types
    fragments = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(fragments) > 1 and "".join(fragments) == call.function.arguments
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"] == [
        {
            "type": "function_call",
            "id": done["output"][0]["id"],
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": call.function.arguments,
            "status": "completed",
        }
    ]


def test_an_answer_cut_at_max_tokens_is_incomplete() -> None:
    sequence = _sequence()
    events = sequence.opening() + sequence.text("abc") + sequence.finish(_final("abc", finish="length"))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_two_readers_of_the_same_events_number_them_alike() -> None:
    def run() -> list[dict]:
        sequence = _sequence()
        return sequence.opening() + sequence.text("a") + sequence.text("b") + sequence.finish(_final("ab"))

    assert run() == run()


@pytest.mark.parametrize("starting_after", [None, 3, 5])
def test_a_stream_s_templated_deltas_are_the_events_rendered(starting_after: int | None) -> None:
    # The stream renders a token's delta from a template; it must be the event the sequence would build
    # and render, numbered alike, the first one opening the text, and those a resumed reader has dropped.
    tokens = ["Hel", "", 'lo "w"', "\n\u00e9\u2028", "\\ </x>"]
    built, templated = _sequence(), _sequence()
    expected = render(built.opening(), starting_after)
    streamed = render(templated.opening(), starting_after)
    for token in tokens:
        expected += render(built.text(token), starting_after)
        streamed += templated.rendered_text(json.dumps(token, ensure_ascii=False), starting_after)
    assert streamed == expected
    final = _final("".join(tokens))
    assert render(templated.finish(final)) == render(built.finish(final))
    # Stored tokens' JSON may escape what json.dumps(ensure_ascii=False) leaves as it is: same text.
    escaped = _sequence()
    escaped.opening()
    for token in tokens:
        escaped.rendered_text(json.dumps(token), starting_after)
    assert escaped.finish(final)[0]["text"] == "".join(tokens)
