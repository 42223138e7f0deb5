"""A message's stored request and result (``db/payloads.py``): written as the JSON these columns always
held, and rows written before the models read back through them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from oasst_inference_server.db.payloads import (
    RequestPayload,
    ResultPayload,
    read_embeddings,
    read_request,
    read_result,
)
from oasst_shared.protocol import ChatTurn
from oasst_shared.tool_calls import NamedToolChoice, ToolCall, ToolDefinition

THREAD = [
    ChatTurn(role="system", content="be brief"),
    ChatTurn(role="user", content="weather in Paris?"),
]
TOOLS = [
    ToolDefinition.model_validate(
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    )
]
CALLS = [
    ToolCall.model_validate({"id": "c1", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}})
]


def old_chat_payload(tools: Any, tool_choice: Any) -> dict[str, Any]:
    """What openai_service wrote before the models, field by field."""
    payload: dict[str, Any] = {"thread": [t.model_dump(mode="json", exclude_none=True) for t in THREAD]}
    if tools:
        payload["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in tools]
        payload["tool_choice"] = (
            tool_choice if isinstance(tool_choice, str | None) else tool_choice.model_dump(mode="json")
        )
    return payload


@pytest.mark.parametrize(
    "tool_choice", [None, "auto", NamedToolChoice.model_validate({"function": {"name": "weather"}})]
)
def test_a_chat_request_is_written_as_before_key_for_key(tool_choice: Any) -> None:
    written = RequestPayload(thread=THREAD, tools=TOOLS, tool_choice=tool_choice).stored()
    assert written == old_chat_payload(TOOLS, tool_choice)
    assert list(written) == ["thread", "tools", "tool_choice"]  # a null tool_choice is kept, as before
    assert RequestPayload(thread=THREAD).stored() == old_chat_payload(None, None)


def test_completion_and_embedding_requests_and_results_are_written_as_before() -> None:
    assert RequestPayload(raw_prompt="Once upon").stored() == {"raw_prompt": "Once upon"}
    assert RequestPayload(inputs=["a", "b"]).stored() == {"inputs": ["a", "b"]}
    assert ResultPayload(tool_calls=CALLS).stored() == {
        "tool_calls": [c.model_dump(mode="json") for c in CALLS]
    }
    assert ResultPayload(embeddings=[[0.5, -1.0]]).stored() == {"embeddings": [[0.5, -1.0]]}


def test_a_stored_response_keeps_its_request_in_the_same_order() -> None:
    old = old_chat_payload(TOOLS, "auto")
    payload = RequestPayload.model_validate(old)
    payload.response = {"model": "m", "input_items": []}
    assert list(payload.stored().items()) == list(
        {**old, "response": {"model": "m", "input_items": []}}.items()
    )


def test_rows_written_before_the_models_read_back() -> None:
    old = {**old_chat_payload(TOOLS, "required"), "response": {"model": "m"}, "something_older": 1}
    read = read_request(old, what="test")
    assert (
        read is not None and read.thread == THREAD and read.tools == TOOLS and read.tool_choice == "required"
    )
    assert read.response == {"model": "m"}
    result = read_result({"tool_calls": [c.model_dump(mode="json") for c in CALLS]}, what="test")
    assert result is not None and result.tool_calls == CALLS
    assert read_embeddings({"embeddings": [[1, 2.5]]}) == [[1.0, 2.5]]


@pytest.mark.parametrize("stored", [["not", "an", "object"], {"thread": 5}, {"inputs": 3}, {"tools": 7}])
def test_a_request_that_no_longer_reads_is_refused_where_it_acts_and_none_where_it_is_shown(
    stored: Any,
) -> None:
    with pytest.raises(ValidationError):
        RequestPayload.model_validate(stored)
    assert read_request(stored, what="test") is None


def test_results_that_no_longer_read_are_none() -> None:
    assert read_result({"tool_calls": "x"}, what="test") is None
    assert read_result(None, what="test") is None
    assert read_embeddings({"embeddings": "x"}) is None and read_embeddings(None) is None
    assert read_embeddings({"tool_calls": []}) is None


def test_the_fair_queue_estimate_counts_the_stored_text_as_before() -> None:
    old = old_chat_payload(None, None)
    before = sum(len(str(old.get(key) or "")) for key in ("thread", "raw_prompt", "inputs"))
    assert RequestPayload(thread=THREAD).estimated_characters() == before
    assert RequestPayload(inputs=["abc", "de"]).estimated_characters() == len(str(["abc", "de"]))
