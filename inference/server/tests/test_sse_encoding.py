"""Events as written to SSE clients: one ``data:`` line each, ids where stored, parseable back."""

from __future__ import annotations

import json

from oasst_inference_server.dispatch import events
from oasst_inference_server.streams.sse import encode_sse


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
