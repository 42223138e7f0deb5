"""A process's own answer channel on the broker, for requests sent to another replica's command channel
(a worker's socket lives on one replica): the remote tokenize questions (``workers.remote_questions``)
and the model switch commands (``fleet.switcher``).

The channel is subscribed at the first request and kept (made again after a broker outage ended it); a
request is published only once it is subscribed, so no answer can be lost to the subscription's delay.
Answers are matched to their request by its id; one that does not come within the timeout fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from typing import Generic, TypeVar

from loguru import logger

from oasst_inference_server.broker.base import Broker, BrokerError

Reply = TypeVar("Reply")


class ReplyTimeout(Exception):
    """No answer came in time (the replica holding the socket is gone, or the broker lost the request)."""


class ReplyChannel(Generic[Reply]):
    """``parse``: an answer's text -> (its request id, the answer), or None for text that is not one."""

    def __init__(self, broker: Broker, name: str, parse: Callable[[str], tuple[str, Reply] | None]) -> None:
        self._broker = broker
        self._name = name
        self._parse = parse
        self.channel = f"{name}:{uuid.uuid4().hex}"
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def request(self, channel: str, request_id: str, payload: str, timeout: float) -> Reply:
        """Publish ``payload`` (which names :attr:`channel` for its answer) on ``channel`` and wait for the
        answer to ``request_id``; raises :class:`ReplyTimeout` or :class:`BrokerError`."""
        answer: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = answer
        try:
            async with asyncio.timeout(timeout):
                await self._listening()
                await self._broker.publish_command(channel, payload)
                return await answer
        except TimeoutError:
            raise ReplyTimeout(f"no answer within {timeout:g}s") from None
        finally:
            self._waiting.pop(request_id, None)

    async def _listening(self) -> None:
        if self._listener is None or self._listener.done():
            self._subscribed.clear()
            self._listener = asyncio.create_task(self._listen(), name=self._name)
        waiting = asyncio.ensure_future(self._subscribed.wait())
        try:
            await asyncio.wait([waiting, self._listener], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not self._subscribed.is_set():
            raise BrokerError(f"the {self._name} channel could not be subscribed")

    async def _listen(self) -> None:
        try:
            async with self._broker.subscribe_commands(self.channel) as answers:
                self._subscribed.set()
                async for data in answers:
                    self._answered(data)
        except BrokerError as exc:
            logger.warning("the {} channel ended: {}", self._name, exc)
        finally:
            self._subscribed.clear()

    def _answered(self, data: str) -> None:
        parsed = self._parse(data)
        if parsed is None:
            return
        request_id, reply = parsed
        waiting = self._waiting.get(request_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(reply)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
