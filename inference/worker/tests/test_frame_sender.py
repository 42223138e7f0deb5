"""The frame sender: order kept, tokens batched only when they queue up, results confirmed, failures raised."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from websockets.exceptions import ConnectionClosed

from oasst_shared.protocol import (
    Drain,
    GeneratedText,
    Pong,
    Token,
    TokenBatch,
    parse_worker_frame,
)
from oasst_shared.token_frames import TokenFrame
from oasst_worker.connection import frame_sender
from oasst_worker.connection.frame_sender import FrameSender


class GatedSocket:
    """Records what is sent; each send waits for the gate; can be told to fail."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def send(self, message: str) -> None:
        await self.gate.wait()
        if self.fail:
            raise ConnectionClosed(None, None)
        self.sent.append(message)

    def frames(self) -> list[object]:
        return [parse_worker_frame(text) for text in self.sent]

    def tokens(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for frame in self.frames():
            if isinstance(frame, Token):
                out.append((frame.message_id, frame.text))
            elif isinstance(frame, TokenBatch):
                out.extend((t.message_id, t.text) for t in frame.tokens)
        return out


@pytest.fixture
def socket() -> GatedSocket:
    return GatedSocket()


@pytest.fixture
async def sender(socket: GatedSocket) -> AsyncIterator[FrameSender]:
    sender = FrameSender(socket, max_pending=16)
    task = asyncio.create_task(sender.run())
    yield sender
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def token(message_id: str, text: str) -> TokenFrame:
    return TokenFrame(message_id, text)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_lone_token_goes_out_at_once_as_a_token_frame(
    socket: GatedSocket, sender: FrameSender
) -> None:
    await sender.send(token("m", "hi"))
    await settle()
    assert [json.loads(text)["type"] for text in socket.sent] == ["token"]


async def test_tokens_queued_during_a_write_leave_as_one_batch_in_order(
    socket: GatedSocket, sender: FrameSender
) -> None:
    socket.gate.clear()
    await sender.send(token("a", "0"))
    await settle()  # the writer holds "0" at the gate
    for i in range(1, 6):
        await sender.send(token("a" if i % 2 else "b", str(i)))
    socket.gate.set()
    await settle()
    frames = socket.frames()
    assert [type(f).__name__ for f in frames] == ["Token", "TokenBatch"]
    assert socket.tokens() == [("a", "0"), ("a", "1"), ("b", "2"), ("a", "3"), ("b", "4"), ("a", "5")]


async def test_a_result_waits_until_written_and_follows_its_tokens(
    socket: GatedSocket, sender: FrameSender
) -> None:
    socket.gate.clear()
    await sender.send(token("m", "a"))
    await sender.send(token("m", "b"))
    result = GeneratedText(message_id="m", text="ab", finish_reason="eos_token", generated_tokens=2)
    written = asyncio.create_task(sender.send(result))
    await settle()
    assert not written.done()
    socket.gate.set()
    await asyncio.wait_for(written, 5)
    frames = socket.frames()
    assert isinstance(frames[-1], GeneratedText)
    assert socket.tokens() == [("m", "a"), ("m", "b")]


async def test_other_frames_split_token_runs(socket: GatedSocket, sender: FrameSender) -> None:
    socket.gate.clear()
    await sender.send(token("m", "0"))
    await settle()
    await sender.send(token("m", "1"))
    await sender.send(token("m", "2"))
    pong = asyncio.create_task(sender.send(Pong(ping_id="p", free_slots=1)))
    await settle()
    await sender.send(token("m", "3"))
    socket.gate.set()
    await asyncio.wait_for(pong, 5)
    await settle()
    assert [type(f).__name__ for f in socket.frames()] == ["Token", "TokenBatch", "Pong", "Token"]


async def test_long_runs_are_split_into_bounded_batches(
    socket: GatedSocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frame_sender, "MAX_TOKENS_PER_BATCH", 4)
    sender = FrameSender(socket, max_pending=100)
    socket.gate.clear()
    for i in range(10):
        await sender.send(token("m", str(i)))
    task = asyncio.create_task(sender.run())
    socket.gate.set()
    await settle()
    assert [len(f.tokens) if isinstance(f, TokenBatch) else 1 for f in socket.frames()] == [4, 4, 2]
    assert [t for _, t in socket.tokens()] == [str(i) for i in range(10)]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_full_queue_makes_send_wait(socket: GatedSocket, sender: FrameSender) -> None:
    socket.gate.clear()
    await sender.send(token("m", "in flight"))
    await settle()
    for i in range(16):
        await sender.send(token("m", str(i)))
    blocked = asyncio.create_task(sender.send(token("m", "17th")))
    await settle()
    assert not blocked.done()
    socket.gate.set()
    await asyncio.wait_for(blocked, 5)


async def test_a_broken_connection_fails_waiting_and_later_sends(socket: GatedSocket) -> None:
    sender = FrameSender(socket)
    task = asyncio.create_task(sender.run())
    socket.fail = True
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(sender.send(Drain()), 5)
    await asyncio.wait_for(task, 5)  # the writer ends quietly; the reader sees the close
    with pytest.raises(ConnectionClosed):
        await sender.send(token("m", "late"))


async def test_stopping_the_writer_fails_frames_it_did_not_write(socket: GatedSocket) -> None:
    sender = FrameSender(socket)
    task = asyncio.create_task(sender.run())
    socket.gate.clear()
    pending = asyncio.create_task(sender.send(Drain()))
    await settle()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(pending, 5)


def test_max_pending_must_be_positive(socket: GatedSocket) -> None:
    with pytest.raises(ValueError, match="max_pending"):
        FrameSender(socket, max_pending=0)


# ---------------------------------------------------------------- the frame limit


async def test_a_batch_over_the_frame_limit_is_split_and_nothing_is_lost(
    socket: GatedSocket, sender: FrameSender
) -> None:
    from oasst_shared.protocol import MAX_FRAME_BYTES

    big = "x" * (MAX_FRAME_BYTES // 8)
    socket.gate.clear()
    await sender.send(token("a", "first"))
    await settle()
    for i in range(12):  # twelve eighths of the limit queue up behind the first write
        await sender.send(token("a", f"{i}{big}"))
    socket.gate.set()
    await settle()
    assert all(len(text.encode()) <= MAX_FRAME_BYTES for text in socket.sent)
    assert len(socket.sent) >= 3
    assert socket.tokens() == [("a", "first")] + [("a", f"{i}{big}") for i in range(12)]


async def test_a_result_over_the_frame_limit_becomes_an_error_for_its_message_only(
    socket: GatedSocket, sender: FrameSender
) -> None:
    from oasst_shared.protocol import MAX_FRAME_BYTES, WorkerError

    huge = GeneratedText(
        message_id="big", text="y" * (MAX_FRAME_BYTES + 1), finish_reason="length", generated_tokens=1
    )
    await sender.send(huge)  # returns once written, as any result
    await sender.send(
        GeneratedText(message_id="small", text="ok", finish_reason="length", generated_tokens=1)
    )
    frames = socket.frames()
    assert isinstance(frames[0], WorkerError) and frames[0].message_id == "big" and not frames[0].retryable
    assert "frame" in frames[0].error
    assert isinstance(frames[1], GeneratedText) and frames[1].message_id == "small"


async def test_a_token_no_frame_may_carry_becomes_an_error_for_its_message_only(
    socket: GatedSocket, sender: FrameSender
) -> None:
    # Jobs check their text before sending; the sender does not let such a token end the connection.
    from oasst_shared.protocol import WorkerError

    socket.gate.clear()
    await sender.send(token("a", "first"))
    await settle()
    for message_id, text in (("a", " ok"), ("bad", "\ud800"), ("a", " fine")):
        await sender.send(token(message_id, text))
    socket.gate.set()
    await settle()
    frames = socket.frames()
    errors = [f for f in frames if isinstance(f, WorkerError)]
    assert [(e.message_id, e.retryable) for e in errors] == [("bad", False)]
    assert socket.tokens() == [("a", "first"), ("a", " ok"), ("a", " fine")]
