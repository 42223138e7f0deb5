"""Writing a connection's frames: in order, from one task, with the tokens that queue up batched.

Every frame goes through :meth:`FrameSender.send`. One task writes them in the order they were
queued; while it writes, new frames gather, and a run of tokens among them leaves as one
``token_batch`` frame (protocol 2) instead of a frame each. A lone token leaves at once, as a
``token`` frame, so there is no timer and no added delay; batching only happens under load, where
it saves the worker and the server a websocket frame, a JSON document and a parse per token. Tokens are
:class:`~oasst_shared.token_frames.TokenFrame` structs written by msgspec (no pydantic model per
token); every other frame is its protocol model.

A token is queued and forgotten (the job goes on generating); any other frame returns once it is
written, so a result, an error or a pong is known to be on the wire, and a failed connection raises
``ConnectionClosed`` to its sender. Past ``max_pending`` queued frames, :meth:`send` waits: a worker
whose server reads slowly slows its jobs instead of growing memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Protocol, TypeAlias

from loguru import logger
from pydantic import BaseModel
from websockets.exceptions import ConnectionClosed

from oasst_shared.protocol import MAX_FRAME_BYTES, WorkerError, dump_frame, fits_in_frame
from oasst_shared.token_frames import TokenFrame, UnsendableText, encode_tokens

DEFAULT_MAX_PENDING = 4096
# A batch is one websocket frame: keep it well under the frame size limit (MAX_FRAME_BYTES); a batch
# that is over it all the same is split.
MAX_TOKENS_PER_BATCH = 512

# What a job sends: a token, or any other frame of the protocol.
OutgoingFrame: TypeAlias = TokenFrame | BaseModel
_Queued: TypeAlias = tuple[OutgoingFrame, asyncio.Future[None] | None]


class _Socket(Protocol):
    async def send(self, message: str) -> None: ...


class FrameSender:
    def __init__(self, ws: _Socket, *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._ws = ws
        self._max_pending = max_pending
        self._queue: list[_Queued] = []
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False

    @property
    def closed(self) -> bool:
        """The connection is gone: every send raises ``ConnectionClosed``."""
        return self._closed

    async def send(self, frame: OutgoingFrame) -> None:
        """Queue ``frame``; a token returns at once, any other frame once written."""
        while len(self._queue) >= self._max_pending and not self._closed:
            self._room.clear()
            await self._room.wait()
        if self._closed:
            raise ConnectionClosed(None, None)
        if isinstance(frame, TokenFrame):
            self.queue_token(frame)  # there is room, and the sender is open: queued
            return
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((frame, written))
        self._wakeup.set()
        await written

    def queue_token(self, frame: TokenFrame) -> bool:
        """Queue a token without awaiting, if there is room (what :meth:`send` does for a token, minus
        its coroutine); False if :meth:`send` must be awaited instead (full, or closed)."""
        if self._closed or len(self._queue) >= self._max_pending:
            return False
        self._queue.append((frame, None))
        self._wakeup.set()
        return True

    async def run(self) -> None:
        """The writer task, for the life of the connection; ends when a write fails."""
        batch: list[_Queued] = []
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                batch, self._queue = self._queue, []
                self._room.set()
                for text, futures in _frames(batch):
                    await self._ws.send(text)
                    for future in futures:
                        if not future.done():
                            future.set_result(None)
                batch = []
        except ConnectionClosed:
            pass  # the connection's reader sees the close too and ends the connection
        finally:
            self._close(batch)

    def _close(self, unsent: list[_Queued]) -> None:
        self._closed = True
        self._room.set()
        for _, future in unsent + self._queue:
            if future is not None and not future.done():
                future.set_exception(ConnectionClosed(None, None))
        self._queue = []


def _frames(batch: list[_Queued]) -> Iterator[tuple[str, list[asyncio.Future[None]]]]:
    """The websocket frames for queued frames, in order: runs of tokens become token batches."""
    run: list[TokenFrame] = []
    for frame, future in batch:
        if isinstance(frame, TokenFrame):
            run.append(frame)
            if len(run) == MAX_TOKENS_PER_BATCH:
                yield from _token_frames(run)
                run = []
            continue
        if run:
            yield from _token_frames(run)
            run = []
        yield _bounded(frame), [future] if future is not None else []
    if run:
        yield from _token_frames(run)


def _token_frames(run: list[TokenFrame]) -> Iterator[tuple[str, list[asyncio.Future[None]]]]:
    try:
        text: str | None = encode_tokens(run)
    except UnsendableText:  # jobs check their text first: split down to the token at fault
        text = None
    if text is not None and fits_in_frame(text):
        yield text, []
    elif len(run) > 1:
        half = len(run) // 2
        yield from _token_frames(run[:half])
        yield from _token_frames(run[half:])
    else:
        yield _bounded(run[0]), []


def _bounded(frame: OutgoingFrame) -> str:
    """The frame's text; a frame over the limit, or a token no frame may carry, becomes an error for
    its message (only it fails)."""
    message_id = getattr(frame, "message_id", None)
    if isinstance(frame, TokenFrame):
        try:
            text = encode_tokens([frame])
        except UnsendableText as exc:
            logger.error("a token of message {} cannot be sent: {}", message_id, exc)
            return _error(message_id, f"the backend produced text that cannot be sent: {exc}")
    else:
        text = dump_frame(frame)
    if fits_in_frame(text):
        return text
    kind = "token" if isinstance(frame, TokenFrame) else type(frame).__name__
    logger.error("a {} frame of message {} is over the frame limit", kind, message_id)
    return _error(message_id, f"the answer does not fit in a frame of {MAX_FRAME_BYTES} bytes")


def _error(message_id: str | None, error: str) -> str:
    return dump_frame(WorkerError(message_id=message_id, error=error, retryable=False))
