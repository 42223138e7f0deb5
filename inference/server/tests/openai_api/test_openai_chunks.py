"""The OpenAI stream's token chunks made from the stored event's JSON text (no decode per token): the
same chunk, once parsed, as the one made from the decoded text, and the same text offsets."""

from __future__ import annotations

import json

import pytest

from oasst_inference_server import events
from oasst_inference_server.openai_api.openai_streams import ChatChunks, CompletionChunks

TEXTS = [
    " Paris",
    "",
    'say "hi"',
    "back\\slash\\",
    "line\nbreak\r\ttab",
    "naïve 👋 文字",
    '","logprobs":[1]',
    "\x01\x1f\x7f",
    "\u2028\u2029",
]


@pytest.mark.parametrize("text", TEXTS)
def test_a_plain_token_event_gives_its_text_as_json_and_nothing_else_does(text: str) -> None:
    stored = events.token_event(text)
    assert json.loads(stored) == {"event_type": "token", "text": text}
    json_text = events.plain_token_text(stored)
    assert json_text is not None and json.loads(json_text) == text
    assert events.plain_token_text(events.token_event(text, [{"token": text, "logprob": -0.5}])) is None


def test_other_events_have_no_plain_text() -> None:
    for data in (events.pending_event(1, 2), events.retry_event(2, "lost"), events.error_event("x", None)):
        assert events.plain_token_text(data) is None


@pytest.mark.parametrize("kind", [ChatChunks, CompletionChunks])
def test_chunks_from_the_json_text_equal_chunks_from_the_text(kind: type[ChatChunks]) -> None:
    from_json = kind(id="c1", created=1, model="m")
    from_text = kind(id="c1", created=1, model="m")
    for text in TEXTS:
        json_text = events.plain_token_text(events.token_event(text))
        assert json_text is not None
        a, b = from_json.text_json(json_text), from_text.text(text)
        assert a.startswith("data: ") and a.endswith("\n\n") and "\n" not in a[:-2]
        assert json.loads(a.removeprefix("data: ")) == json.loads(b.removeprefix("data: "))
        assert from_json._offset == from_text._offset
