"""The keep-alive comments of event streams (``api.keep_alive``) with a stand-in ASGI ``send``: a silent
stream gets ``: keep-alive`` comments, each whole and between events, never inside one; a stream whose
writes keep coming gets none (nothing is written per event but the event); a send that waits (a slow
client) is never joined by another, and nothing follows the end. The real client's view of the four
streaming APIs is tests/e2e/test_keep_alive.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from oasst_inference_server.api.keep_alive import KEEP_ALIVE, KeepAliveSender


class Recorded:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.ended = False
        self.comment = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        assert not self.ended, "sent after the end of the body"
        self.bodies.append(message["body"])
        self.ended = not message["more_body"]
        if message["body"] == KEEP_ALIVE:
            self.comment.set()


async def test_a_silent_stream_gets_comments_between_its_events() -> None:
    recorded = Recorded()
    sender = KeepAliveSender(recorded.send, interval=0.02)
    await sender.write(b"data: one\n\n")
    for _ in range(3):  # three silences, each told by a comment
        recorded.comment.clear()
        await asyncio.wait_for(recorded.comment.wait(), 30)
    await sender.write(b"data: two\n\n")
    await sender.finish()
    assert recorded.bodies[0] == b"data: one\n\n"
    assert recorded.bodies[-2:] == [b"data: two\n\n", b""]
    assert set(recorded.bodies[1:-2]) == {KEEP_ALIVE} and len(recorded.bodies[1:-2]) >= 3
    assert sender.comments == len(recorded.bodies[1:-2])


async def test_writes_that_keep_coming_get_no_comment() -> None:
    recorded = Recorded()
    sender = KeepAliveSender(recorded.send, interval=60.0)
    for n in range(1000):
        await sender.write(f"data: {n}\n\n".encode())
    await sender.finish()
    assert sender.comments == 0
    assert recorded.bodies == [f"data: {n}\n\n".encode() for n in range(1000)] + [b""]


class Blocking:
    """A client whose sends of one body wait until released; records every send that starts while another
    is still under way (on a real connection, bytes of the two interleaved)."""

    def __init__(self, blocked: bytes) -> None:
        self.blocked = blocked
        self.bodies: list[bytes] = []
        self.sending = 0
        self.overlapping: list[bytes] = []
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()
        self.ended = False

    async def send(self, message: dict[str, Any]) -> None:
        assert not self.ended, "sent after the end of the body"
        if self.sending:
            self.overlapping.append(message["body"])
        self.sending += 1
        try:
            if message["body"] == self.blocked:
                self.waiting.set()
                await self.release.wait()
            self.bodies.append(message["body"])
            self.ended = not message["more_body"]
        finally:
            self.sending -= 1


async def test_no_comment_while_a_write_is_being_sent() -> None:
    """A slow client holds a write's send for many intervals: that is no silence, and a comment sent then
    would be written into the middle of the event."""
    client = Blocking(b"data: slow\n\n")
    sender = KeepAliveSender(client.send, interval=0.01)
    write = asyncio.create_task(sender.write(b"data: slow\n\n"))
    await asyncio.wait_for(client.waiting.wait(), 30)
    await asyncio.sleep(0.2)  # twenty intervals with the send under way
    assert client.overlapping == [] and sender.comments == 0
    client.release.set()
    await write
    await sender.finish()
    assert client.overlapping == []
    assert client.bodies[0] == b"data: slow\n\n" and client.bodies[-1] == b""
    assert set(client.bodies[1:-1]) <= {KEEP_ALIVE}


async def test_a_write_during_a_comment_goes_out_after_it_whole() -> None:
    client = Blocking(KEEP_ALIVE)
    sender = KeepAliveSender(client.send, interval=0.01)
    await asyncio.wait_for(client.waiting.wait(), 30)  # the silence's comment, its send under way
    write = asyncio.create_task(sender.write(b"data: one\n\n"))
    await asyncio.sleep(0.05)
    assert client.overlapping == [] and client.bodies == []
    client.release.set()
    await write
    await sender.finish()
    assert client.overlapping == []
    assert client.bodies[:2] == [KEEP_ALIVE, b"data: one\n\n"] and client.bodies[-1] == b""


async def test_nothing_after_the_end_of_the_body() -> None:
    """A stream that ends while its comment's send waits: the comment is dropped, the end is the last
    thing sent, and the timer says nothing more."""
    client = Blocking(KEEP_ALIVE)
    sender = KeepAliveSender(client.send, interval=0.01)
    await asyncio.wait_for(client.waiting.wait(), 30)
    await sender.finish()
    await asyncio.sleep(0.1)  # ten intervals after the end
    assert client.overlapping == [] and client.bodies == [b""]
    assert sender.comments == 0


def test_the_openai_sdk_reads_the_events_around_a_comment_unchanged() -> None:
    """A comment between events with ids, as on a ``/v1`` stream, is skipped by the OpenAI Python SDK's
    parser; a blank line after it would be an event with empty data, which the SDK fails to parse."""
    streaming = pytest.importorskip("openai._streaming")
    first, second = b'id: a/1\ndata: {"n": 1}\n\n', b'id: a/2\ndata: {"n": 2}\n\n'
    decoded = list(streaming.SSEDecoder().iter_bytes(iter([first, KEEP_ALIVE, KEEP_ALIVE, second])))
    assert [(event.id, event.data) for event in decoded] == [("a/1", '{"n": 1}'), ("a/2", '{"n": 2}')]
