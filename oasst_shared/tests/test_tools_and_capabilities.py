"""Protocol 3: capabilities, tools, tool calls and logprobs on the frames; old workers' work frames."""

from __future__ import annotations

import json

import pytest

from oasst_shared.logprobs import TokenLogprob, TopLogprob
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import (
    ChatTurn,
    GeneratedText,
    Token,
    Work,
    WorkerCapabilities,
    WorkerInfo,
    dump_frame,
    dump_work,
    parse_server_frame,
    parse_worker_frame,
)
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schema_keywords import LLAMA_CPP_UNENFORCED, schema_keywords
from oasst_shared.tool_calls import (
    ToolCall,
    ToolCallFunction,
    ToolDefinition,
    called_tools,
    looks_like_tool_call,
    parse_tool_call,
    tool_call_schema,
)

WEATHER = ToolDefinition.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
)
CALL = ToolCall(id="call_1", function=ToolCallFunction(name="get_weather", arguments='{"city": "Oslo"}'))
TOOL_WORK = Work(
    message_id="m",
    model_config_name="x",
    thread=[
        ChatTurn(role="user", content="weather?"),
        ChatTurn(role="assistant", content="", tool_calls=[CALL]),
        ChatTurn(role="tool", content="sunny", tool_call_id="call_1"),
    ],
    sampling_parameters=SamplingParameters(
        logprobs=True,
        top_logprobs=2,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
    ),
    tools=[WEATHER],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
)


@pytest.mark.parametrize(
    "frame",
    [
        WorkerInfo(
            model_config=SMOLLM2_135M,
            max_parallel_requests=2,
            backend_kind="tgi",
            capabilities=WorkerCapabilities(
                structured_output=True, tools=True, logprobs=True, max_top_logprobs=5
            ),
        ),
        Token(
            message_id="m",
            text="Hi",
            logprobs=[
                TokenLogprob(
                    token="Hi",
                    logprob=-0.1,
                    bytes=[72, 105],
                    top_logprobs=[TopLogprob(token="Hi", logprob=-0.1)],
                )
            ],
        ),
        GeneratedText(
            message_id="m", text="", finish_reason="eos_token", generated_tokens=9, tool_calls=[CALL]
        ),
    ],
    ids=lambda f: f.type,
)
def test_protocol_3_worker_frames_round_trip(frame):
    assert parse_worker_frame(dump_frame(frame)) == frame


def test_protocol_3_work_round_trips_and_protocol_2_workers_get_it_without_the_new_fields():
    assert parse_server_frame(dump_frame(TOOL_WORK)) == TOOL_WORK
    assert TOOL_WORK.needs_protocol_3
    old = json.loads(dump_work(TOOL_WORK, 2))
    assert "tools" not in old and "tool_choice" not in old
    assert json.loads(dump_work(TOOL_WORK, 3))["tools"][0]["function"]["name"] == "get_weather"


def test_a_protocol_2_worker_info_has_no_capabilities():
    info = json.loads(
        dump_frame(WorkerInfo(model_config=SMOLLM2_135M, max_parallel_requests=1, backend_kind="tgi"))
    )
    del info["capabilities"]
    parsed = parse_worker_frame(json.dumps(info))
    assert isinstance(parsed, WorkerInfo) and parsed.capabilities == WorkerCapabilities()


def test_common_capabilities_are_what_every_worker_can_do():
    full = WorkerCapabilities(
        structured_output=True, tools=True, logprobs=True, max_top_logprobs=20, presence_penalty=True
    )
    grammar = WorkerCapabilities(
        structured_output=True,
        tools=True,
        logprobs=True,
        max_top_logprobs=5,
        unenforced_schema_keywords=["minimum"],
    )
    common = WorkerCapabilities.common([full, grammar])
    assert common.structured_output and common.tools and common.logprobs
    assert common.max_top_logprobs == 5 and not common.presence_penalty
    assert common.unenforced_schema_keywords == ["minimum"]
    assert WorkerCapabilities.common([]) == WorkerCapabilities()


def test_sampling_parameters_name_the_capabilities_they_need():
    assert TOOL_WORK.sampling_parameters.required_capabilities() == {
        "logprobs": "logprobs",
        "structured_output": "response_format",
    }
    assert SamplingParameters(presence_penalty=0.5).required_capabilities() == {
        "presence_penalty": "presence_penalty"
    }
    assert SamplingParameters(response_format={"type": "json_object"}).output_schema == {"type": "object"}
    assert SamplingParameters(response_format={"type": "text"}).output_schema is None


def test_tool_call_schema_and_parsing():
    other = WEATHER.model_copy(update={"function": WEATHER.function.model_copy(update={"name": "other"})})
    schema = tool_call_schema([WEATHER])
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert len(tool_call_schema([WEATHER, other])["anyOf"]) == 2
    assert called_tools([WEATHER, other], "none") == []
    assert called_tools([WEATHER, other], TOOL_WORK.tool_choice) == [WEATHER]  # type: ignore[arg-type]
    call = parse_tool_call('{"name": "get_weather", "arguments": {"city": "Oslo"}}', [WEATHER])
    assert call is not None and json.loads(call.function.arguments) == {"city": "Oslo"}
    tagged = parse_tool_call('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>', [WEATHER])
    assert tagged is not None and tagged.function.name == "get_weather"
    assert parse_tool_call('{"name": "unknown", "arguments": {}}', [WEATHER]) is None
    assert parse_tool_call("Sunny, probably.", [WEATHER]) is None
    assert looks_like_tool_call("  {") is True and looks_like_tool_call("<tool") is True
    assert looks_like_tool_call("Hello") is False and looks_like_tool_call(" ") is None


def test_schema_keywords_are_keywords_not_property_names():
    schema = {
        "type": "object",
        "properties": {
            "minimum": {"type": "integer", "maximum": 3},
            "tags": {"type": "array", "items": {"enum": [1]}},
        },
        "anyOf": [{"required": ["minimum"]}],
    }
    assert schema_keywords(schema) == {"type", "properties", "anyOf", "maximum", "items", "enum", "required"}


def test_lengths_next_to_a_pattern_or_a_format_are_reported_as_such():
    # llama-cpp-python's converter writes such a string from its pattern or format alone.
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^a+$", "maxLength": 3},
            "b": {"type": "string", "format": "date", "minLength": 1},
            "c": {"type": "string", "format": "email", "maxLength": 3},
        },
    }
    combined = {k for k in schema_keywords(schema) if " with " in k}
    assert combined == {"maxLength with pattern", "minLength with format"}
    assert combined <= set(LLAMA_CPP_UNENFORCED)
