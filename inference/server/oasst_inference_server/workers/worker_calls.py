"""Questions to one worker that it answers with a frame naming the question (protocol 4): ``tokenize``
and ``detokenize``, answered by ``tokenized`` and ``detokenized`` with the same ``request_id``.

One :class:`WorkerCalls` per connection: :meth:`WorkerCalls.ask` sends the question and waits for its
answer within a timeout; the connection hands every answer frame to :meth:`WorkerCalls.answered` and, when
it ends, fails the questions still open (:meth:`WorkerCalls.close`). An answer nobody waits for any more
(late, or unknown) is dropped. At most ``max_open`` questions are open at once: a worker that answers
slowly gets no more until it has answered some, and the asker does without.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from oasst_shared.protocol import Detokenize, Detokenized, Tokenize, Tokenized

DEFAULT_MAX_OPEN = 16


class CallFailed(Exception):
    """No usable answer: a timeout, too many questions open, a closed connection, or the worker's own
    ``error``."""


class WorkerCalls:
    def __init__(self, send: Callable[[BaseModel], Awaitable[None]], *, max_open: int = DEFAULT_MAX_OPEN):
        self._send = send
        self._max_open = max_open
        self._open: dict[str, asyncio.Future[Tokenized | Detokenized]] = {}
        self._closed = False

    @staticmethod
    def new_id() -> str:
        return f"q-{uuid.uuid4().hex[:20]}"

    async def ask(self, question: Tokenize | Detokenize, timeout: float) -> Tokenized | Detokenized:
        """Send ``question`` and return its answer; raises :class:`CallFailed` (never waits longer than
        ``timeout`` seconds, the send included)."""
        if self._closed:
            raise CallFailed("the worker's connection has ended")
        if len(self._open) >= self._max_open:
            raise CallFailed(f"the worker has {len(self._open)} questions open already")
        if question.request_id in self._open:
            raise CallFailed(f"a question {question.request_id} is open already")
        answer: asyncio.Future[Tokenized | Detokenized] = asyncio.get_running_loop().create_future()
        self._open[question.request_id] = answer
        try:
            async with asyncio.timeout(timeout):
                await self._send(question)
                reply = await answer
        except TimeoutError:
            raise CallFailed(f"the worker did not answer within {timeout:g}s") from None
        except CallFailed:
            raise
        except Exception as exc:  # the send failed: the connection is ending
            raise CallFailed(f"the question could not be sent: {exc}") from None
        finally:
            self._open.pop(question.request_id, None)
        expected = Tokenized if isinstance(question, Tokenize) else Detokenized
        if not isinstance(reply, expected):
            raise CallFailed(f"the worker answered a {question.type} with {reply.type}")
        if reply.error is not None:
            raise CallFailed(f"the worker could not answer: {reply.error}")
        return reply

    def answered(self, reply: Tokenized | Detokenized) -> None:
        waiting = self._open.get(reply.request_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(reply)

    def refused(self, request_id: str, why: str) -> None:
        """An answer frame the protocol refused, naming ``request_id``: its question fails alone."""
        waiting = self._open.get(request_id)
        if waiting is not None and not waiting.done():
            waiting.set_exception(CallFailed(f"the worker's answer was refused: {why}"))

    def close(self) -> None:
        self._closed = True
        for waiting in self._open.values():
            if not waiting.done():
                waiting.set_exception(CallFailed("the worker's connection ended"))

    @property
    def open_count(self) -> int:
        return len(self._open)
