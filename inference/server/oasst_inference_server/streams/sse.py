"""Server-sent events: the framing of a batch of a message's events on the wire."""

from __future__ import annotations

SseEvent = dict[str, str]


def encode_sse(batch: list[SseEvent]) -> bytes:
    """One batch as server-sent events, ready to write (``\r\n`` line ends, as sse-starlette's).

    Event data is always one line: the encoders of :mod:`oasst_inference_server.events`
    produce compact JSON (``json.dumps``, ``model_dump_json``), which escapes line breaks, so each
    event is one ``data:`` line.
    """
    return "".join(
        f"id: {event['id']}\r\ndata: {event['data']}\r\n\r\n"
        if "id" in event
        else f"data: {event['data']}\r\n\r\n"
        for event in batch
    ).encode()
