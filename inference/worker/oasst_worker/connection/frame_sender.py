"""Writing a connection's frames: in order, from one task, with the tokens that queue up batched.

Every frame goes through :meth:`FrameSender.send`. One task writes them in the order they were
queued; while it writes, new frames gather, and a run of tokens among them leaves as one
``token_batch`` frame (protocol 2) instead of a frame each. A lone token leaves at once, as a
``token`` frame, so there is no timer and no added delay; batching only happens under load, where
it saves the worker and the server a websocket frame, a JSON document and a parse per token.

A token is queued and forgotten (the job goes on generating); any other frame returns once it is
written, so a result, an error or a pong is known to be on the wire, and a failed connection raises
``ConnectionClosed`` to its sender. Past ``max_pending`` queued frames, :meth:`send` waits: a worker
whose server reads slowly slows its jobs instead of growing memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Protocol

from loguru import logger
from pydantic import BaseModel
from websockets.exceptions import ConnectionClosed

from oasst_shared.protocol import MAX_FRAME_BYTES, Token, TokenBatch, WorkerError, dump_frame, fits_in_frame

DEFAULT_MAX_PENDING = 4096
# A batch is one websocket frame: keep it well under the frame size limit (MAX_FRAME_BYTES); a batch
# that is over it all the same is split.
MAX_TOKENS_PER_BATCH = 512


class _Socket(Protocol):
    async def send(self, message: str) -> None: ...


class FrameSender:
    def __init__(self, ws: _Socket, *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be at least 1")
        self._ws = ws
        self._max_pending = max_pending
        self._queue: list[tuple[BaseModel, asyncio.Future[None] | None]] = []
        self._wakeup = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False

    async def send(self, frame: BaseModel) -> None:
        """Queue ``frame``; a token returns at once, any other frame once written."""
        while len(self._queue) >= self._max_pending and not self._closed:
            self._room.clear()
            await self._room.wait()
        if self._closed:
            raise ConnectionClosed(None, None)
        if isinstance(frame, Token):
            self._queue.append((frame, None))
            self._wakeup.set()
            return
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((frame, written))
        self._wakeup.set()
        await written

    async def run(self) -> None:
        """The writer task, for the life of the connection; ends when a write fails."""
        batch: list[tuple[BaseModel, asyncio.Future[None] | None]] = []
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

    def _close(self, unsent: list[tuple[BaseModel, asyncio.Future[None] | None]]) -> None:
        self._closed = True
        self._room.set()
        for _, future in unsent + self._queue:
            if future is not None and not future.done():
                future.set_exception(ConnectionClosed(None, None))
        self._queue = []


def _frames(
    batch: list[tuple[BaseModel, asyncio.Future[None] | None]],
) -> Iterator[tuple[str, list[asyncio.Future[None]]]]:
    """The websocket frames for queued frames, in order: runs of tokens become token batches."""
    run: list[Token] = []
    for frame, future in batch:
        if isinstance(frame, Token):
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


def _token_frames(run: list[Token]) -> Iterator[tuple[str, list[asyncio.Future[None]]]]:
    text = dump_frame(run[0] if len(run) == 1 else TokenBatch(tokens=run))
    if fits_in_frame(text):
        yield text, []
    elif len(run) > 1:
        half = len(run) // 2
        yield from _token_frames(run[:half])
        yield from _token_frames(run[half:])
    else:
        yield _bounded(run[0]), []


def _bounded(frame: BaseModel) -> str:
    """The frame's text; a frame over the limit becomes an error for its message (only it fails)."""
    text = dump_frame(frame)
    if fits_in_frame(text):
        return text
    message_id = getattr(frame, "message_id", None)
    logger.error("a {} frame of message {} is over the frame limit", type(frame).__name__, message_id)
    return dump_frame(
        WorkerError(
            message_id=message_id,
            error=f"the answer does not fit in a frame of {MAX_FRAME_BYTES} bytes",
            retryable=False,
        )
    )
