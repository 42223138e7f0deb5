"""The SSE ids of resumable ``/v1`` streams: parsing a client's ``Last-Event-ID`` (refused with a clear
400 when malformed) and dropping exactly the chunks a resuming client already has."""

from __future__ import annotations

import pytest

from oasst_inference_server.broker.keys import StreamId
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_inference_server.openai_api.stream_positions import (
    OPENING,
    ChunkIds,
    Position,
    parse_completion_id,
    parse_last_event_id,
    parse_position,
)

CID = "chatcmpl-0f8e2c3a-1111-4222-8333-944445555666"


def test_positions_round_trip_and_order() -> None:
    for text in ("0", "17-3", "17-3.2", "1733535600000-0"):
        assert parse_position(text).wire() == text
    assert parse_position("17-3") < parse_position("17-3.1") < parse_position("17-4") < parse_position("18-0")
    assert OPENING < parse_position("0-1")


@pytest.mark.parametrize(
    "bad", ["", "x", "17-3.", "17-3.0", "17-3.-1", "$", "17-3.1.2", "0-0", "1e5", "17-3.9999999"]
)
def test_malformed_positions_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_position(bad)


def test_a_last_event_id_must_name_this_completion() -> None:
    assert parse_last_event_id(f"{CID}/5-1.2", CID) == Position(StreamId(5, 1), 2)
    for bad in ("chatcmpl-other/5-1", "5-1", f"{CID}/", f"{CID}/5-1/6", f"{CID}/" + "9" * 300):
        with pytest.raises(InvalidRequest) as caught:
            parse_last_event_id(bad, CID)
        assert caught.value.code == "invalid_last_event_id"


def test_completion_ids() -> None:
    assert parse_completion_id(CID, "chatcmpl") == CID.removeprefix("chatcmpl-")
    for bad, prefix in (
        (CID, "cmpl"),
        ("chatcmpl-", "chatcmpl"),
        ("chatcmpl-XYZ", "chatcmpl"),
        ("a" * 100, "cmpl"),
    ):
        with pytest.raises(InvalidRequest):
            parse_completion_id(bad, prefix)


def test_chunks_get_ids_and_a_resumed_stream_drops_what_its_client_has() -> None:
    fresh = ChunkIds(CID, None)
    assert fresh.opening("data: a\n\n") == f"id: {CID}/0\ndata: a\n\n"
    assert fresh.one("5-0", "data: t\n\n") == f"id: {CID}/5-0\ndata: t\n\n"
    closing = ["data: f\n\n", "data: u\n\n", "data: [DONE]\n\n"]
    assert fresh.frame("9-0", closing) == [
        f"id: {CID}/9-0\ndata: f\n\n",
        f"id: {CID}/9-0.1\ndata: u\n\n",
        f"id: {CID}/9-0.2\ndata: [DONE]\n\n",
    ]
    assert fresh.frame(None, closing) == closing  # not stored: no ids

    after_token = ChunkIds(CID, parse_position("5-0"))
    assert after_token.opening("data: a\n\n") is None
    assert after_token.one("5-0", "data: t\n\n") is None and after_token.one("4-9", "x") is None
    assert after_token.one("5-1", "data: t\n\n") == f"id: {CID}/5-1\ndata: t\n\n"

    mid_closing = ChunkIds(CID, parse_position("9-0.1"))
    assert mid_closing.frame("9-0", closing) == [f"id: {CID}/9-0.2\ndata: [DONE]\n\n"]
    assert mid_closing.frame("8-0", closing) == []
    after_opening = ChunkIds(CID, OPENING)
    assert after_opening.opening("x") is None and after_opening.one("0-1", "y") == f"id: {CID}/0-1\ny"


def _sdk_read(body: str) -> list[str]:
    """The texts the OpenAI SDK's own stream reader gets from ``body`` (raises if it cannot parse it)."""
    import httpx
    import openai
    from openai.types.chat import ChatCompletionChunk

    response = httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})
    client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")
    stream = openai.Stream(cast_to=ChatCompletionChunk, response=response, client=client)
    try:
        return [c.choices[0].delta.content or "" for c in stream if c.choices]
    finally:
        client.close()


def test_the_sdk_reads_a_stream_with_ids_and_queue_comments() -> None:
    from oasst_inference_server.openai_api.openai_streams import (
        DONE,
        ChatChunks,
        pending_comment,
        pending_comment_line,
    )
    from oasst_shared.schemas import PendingEvent

    ids = ChunkIds(CID, None)
    chunks = ChatChunks(CID, 1, "model")
    waiting = PendingEvent(queue_position=2, queue_size=3, estimated_wait_seconds=4.0)
    head = [
        ids.opening(chunks.start() or "") or "",
        pending_comment_line(waiting),
        pending_comment_line(waiting),
    ]
    body = "".join(
        [*head, ids.one("5-0", chunks.text("Hel")) or "", ids.one("6-0", chunks.text("lo")) or ""]
        + ids.frame("7-0", [chunks.finish("stop"), DONE])
    )
    assert _sdk_read(body) == ["", "Hel", "lo", ""]  # the role, the text, the finish
    # A comment with the usual blank line after it, once an id was seen, is an empty event to the SDK.
    with pytest.raises(ValueError):
        _sdk_read(head[0] + pending_comment(waiting) + DONE)
