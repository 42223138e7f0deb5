"""Keep-alive comments on silent event streams.

A proxy or load balancer with a read timeout drops a response that says nothing for longer than that
timeout, and an event stream can be silent for minutes: a job waiting in a long prefill, a worker that
holds its streams. After ``interval`` seconds with nothing written, a stream gets the comment line
``: keep-alive`` (clients ignore SSE comments: no event's data changes), then again after each further
``interval`` of silence. A stream whose events flow never gets one.

The comment is one line with no blank line after it, as the queue comments of ``/v1`` streams
(``openai_api.openai_streams.pending_comment_line``): a blank line after an event with an id is, to the
OpenAI Python SDK, an event with the same id and empty data, which it cannot parse. Written between two
whole events, a comment line is skipped by every SSE parser (browsers, the SDKs, the text-client).

One timer per stream, re-armed only when it fires: a write costs the stream nothing but noting its
time, never a comment, a timer or a lock per token. The comment goes out from a task of its own, which
the timer starts only while no write is being sent (a count of writes in flight says so), and a write
that comes while a comment is being sent waits for it: the two never interleave on the connection.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import Send

KEEP_ALIVE = b": keep-alive\n"


class KeepAliveSender:
    """Writes one response's body chunks, and a keep-alive comment after ``interval`` seconds of silence.

    Made after the response's start was sent; :meth:`finish` sends the end of the body and stops the
    timer (:meth:`stop` alone where the stream ended otherwise)."""

    def __init__(self, send: Send, interval: float) -> None:
        self._send = send
        self._interval = interval
        self._loop = asyncio.get_running_loop()
        self._writing = 0  # writes under way: no comment starts meanwhile
        self._last_write = self._loop.time()
        self._comment: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(interval, self._due)
        self.comments = 0  # keep-alive comments sent (for tests and the logs)

    async def write(self, chunk: bytes) -> None:
        self._writing += 1
        try:
            await self._after_comment()
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            self._writing -= 1
        self._last_write = self._loop.time()

    async def finish(self) -> None:
        self.stop()
        await self._after_comment()
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._comment is not None and not self._comment.done():
            self._comment.cancel()

    async def _after_comment(self) -> None:
        """Once the comment being sent, if any, is out (rare: the stream had been silent)."""
        comment = self._comment
        if comment is not None and not comment.done():
            # wait, not await: a write cancelled here must not cancel the comment halfway.
            await asyncio.wait((comment,))

    def _due(self) -> None:
        """The timer: a comment if the stream has been silent for ``interval``, else wait until it may be."""
        now = self._loop.time()
        silent_for = now - self._last_write
        busy = self._writing > 0 or (self._comment is not None and not self._comment.done())
        if busy or silent_for < self._interval:
            # A write under way (a slow client) is not silence; else the rest of the interval.
            delay = self._interval if busy else self._interval - silent_for
            self._timer = self._loop.call_later(delay, self._due)
            return
        self._comment = self._loop.create_task(self._send_comment(), name="keep-alive comment")
        self._timer = self._loop.call_later(self._interval, self._due)

    async def _send_comment(self) -> None:
        # A failed send is the client gone: the stream's own write or its disconnect listener ends it.
        with contextlib.suppress(Exception):
            await self._send({"type": "http.response.body", "body": KEEP_ALIVE, "more_body": True})
            self._last_write = self._loop.time()
            self.comments += 1
