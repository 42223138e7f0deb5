"""Names in a ``/v1`` request are validated against the whole string, as every name in oasst_shared is
(oasst_shared/tests/test_names.py): a tool choice that differs from a tool's name by its end, and a
message's author with a trailing newline, spaces, controls or look-alike characters, are refused."""

from __future__ import annotations

import pytest

from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest, ChatMessage
from tests.support.name_edges import EDGES, refused


@pytest.mark.parametrize("name", EDGES, ids=repr)
def test_a_tool_choice_name_in_a_request_matches_whole(name):
    # In a request, a choice that differs from a tool's name by its end is refused too.
    tool = {"type": "function", "function": {"name": "get_weather"}}
    refused(
        lambda n: ChatCompletionRequest.model_validate(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": "get_weather" + n}},
            }
        ),
        name if name else "\n",
    )


@pytest.mark.parametrize("name", [n for n in EDGES if n not in ("nаme", "name\u200b")], ids=repr)
def test_a_message_author_name_matches_whole(name):
    refused(lambda n: ChatMessage(role="user", content="hi", name=n), name)


def test_an_ordinary_author_name_passes():
    assert ChatMessage(role="user", content="hi", name="Ada_Lovelace-1815").name == "Ada_Lovelace-1815"
