"""Events as written to SSE clients: one ``data:`` line each, ids where stored, parseable back."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from oasst_inference_server import events
from oasst_inference_server.streams.sse import encode_sse
from oasst_shared.schemas import TERMINAL_EVENT_TYPES, MessageRead


def test_a_batch_is_one_event_per_entry_even_with_line_breaks_in_the_text() -> None:
    text = "line one\nline two\r\nend 👋"
    body = encode_sse(
        [{"data": events.pending_event(2, 5)}, {"id": "17-0", "data": events.token_event(text)}]
    ).decode()
    blocks = body.split("\r\n\r\n")
    assert blocks[-1] == "" and len(blocks) == 3
    assert blocks[0] == 'data: {"event_type":"pending","queue_position":2,"queue_size":5}'
    event_id, data = blocks[1].split("\r\n")
    assert event_id == "id: 17-0"
    assert json.loads(data.removeprefix("data: ")) == {"event_type": "token", "text": text}


def test_the_terminal_rule_reads_stored_and_decoded_events_alike() -> None:
    finished = MessageRead(
        id="m",
        chat_id=None,
        parent_id=None,
        role="assistant",
        state="complete",
        content="Done.",
        created_at=datetime.now(UTC),
    )
    stored = {
        events.message_event(finished): True,
        events.error_event("the worker failed", None): True,
        events.pending_event(1, 1): False,
        events.token_event("hi"): False,
        events.retry_event(2, "worker lost"): False,
        events.gap_event("1-0", "5-0"): False,
    }
    for data, terminal in stored.items():
        event_type = json.loads(data)["event_type"]
        assert events.is_terminal(data) is terminal is events.is_terminal_type(event_type), event_type
    assert {json.loads(d)["event_type"] for d, t in stored.items() if t} == TERMINAL_EVENT_TYPES
