"""Questions for a worker whose socket another replica holds: sent and answered through the broker.

A replica asks the workers connected to it directly (:mod:`.worker_calls`). A worker of another
replica is reached as a cancel is, on its session's command channel: the question travels in a
``question`` command naming the asker's answer channel; the replica holding the socket asks its worker
and publishes the answer there, or its failure as an answer with ``error``. Each process subscribes to
its own answer channel at its first remote question and keeps the subscription (it is made again after
a broker outage ended it). A question whose answer does not come within its timeout fails, as a local
one does.

May import dispatch (events, worker_calls), broker; not api, openai_api, submission or admission.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Annotated, Literal

from loguru import logger
from pydantic import BaseModel, Field, ValidationError

from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.dispatch.events import worker_command_channel
from oasst_inference_server.dispatch.worker_calls import CallFailed, WorkerCalls
from oasst_shared.protocol import (
    Detokenize,
    Detokenized,
    ProtocolError,
    Tokenize,
    Tokenized,
    dump_frame,
    parse_worker_frame,
)

_QUESTION_PREFIX = '{"type":"question"'


class RemoteQuestion(BaseModel):
    """A question for the worker of a session, as its command channel carries it."""

    type: Literal["question"] = "question"
    reply_to: str = Field(description="The channel the asker reads answers on.")
    timeout: float = Field(gt=0, le=60, description="Seconds the asker waits.")
    question: Annotated[Tokenize | Detokenize, Field(discriminator="type")]


def is_question(command: str) -> bool:
    return command.startswith(_QUESTION_PREFIX)


async def answer_question(calls: WorkerCalls, broker: Broker, command: str) -> None:
    """Ask this replica's worker the ``question`` command and publish the answer, or why there is none."""
    try:
        remote = RemoteQuestion.model_validate_json(command)
    except ValidationError as exc:
        logger.warning("a question command that does not parse: {}", exc.errors(include_url=False)[:1])
        return
    question = remote.question
    try:
        reply: Tokenized | Detokenized = await calls.ask(question, remote.timeout)
    except CallFailed as exc:
        reply = (
            Tokenized(request_id=question.request_id, error=str(exc)[:4000])
            if isinstance(question, Tokenize)
            else Detokenized(request_id=question.request_id, error=str(exc)[:4000])
        )
    try:
        await broker.publish_command(remote.reply_to, dump_frame(reply))
    except BrokerError as exc:
        logger.warning("the answer to {} could not be published: {}", question.request_id, exc)


class RemoteQuestions:
    """This process's questions to workers of other replicas, and its answer channel."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.channel = f"worker-answers:{uuid.uuid4().hex}"
        self._waiting: dict[str, asyncio.Future[Tokenized | Detokenized]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    async def ask(
        self, session_id: str, question: Tokenize | Detokenize, timeout: float
    ) -> Tokenized | Detokenized:
        """The answer of the worker of ``session_id`` (on any replica); raises :class:`CallFailed`."""
        answer: asyncio.Future[Tokenized | Detokenized] = asyncio.get_running_loop().create_future()
        self._waiting[question.request_id] = answer
        try:
            async with asyncio.timeout(timeout):
                await self._listening()
                command = RemoteQuestion(reply_to=self.channel, timeout=timeout, question=question)
                await self._broker.publish_command(
                    worker_command_channel(session_id), command.model_dump_json()
                )
                reply = await answer
        except TimeoutError:
            raise CallFailed(f"no answer from worker {session_id} within {timeout:g}s") from None
        except BrokerError as exc:
            raise CallFailed(f"the question could not be sent: {exc}") from None
        finally:
            self._waiting.pop(question.request_id, None)
        if reply.error is not None:
            raise CallFailed(f"the worker could not answer: {reply.error}")
        return reply

    async def _listening(self) -> None:
        """The answer channel is subscribed (a question published before that could lose its answer)."""
        if self._listener is None or self._listener.done():
            self._subscribed.clear()
            self._listener = asyncio.create_task(self._listen(), name="worker answers")
        waiting = asyncio.ensure_future(self._subscribed.wait())
        try:
            await asyncio.wait([waiting, self._listener], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if not self._subscribed.is_set():
            raise CallFailed("the answer channel could not be subscribed")

    async def _listen(self) -> None:
        try:
            async with self._broker.subscribe_commands(self.channel) as answers:
                self._subscribed.set()
                async for data in answers:
                    self._answered(data)
        except BrokerError as exc:
            logger.warning("the worker answer channel ended: {}", exc)
        finally:
            self._subscribed.clear()

    def _answered(self, data: str) -> None:
        try:
            reply = parse_worker_frame(data)
        except ProtocolError:
            return
        if isinstance(reply, (Tokenized, Detokenized)):
            waiting = self._waiting.get(reply.request_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(reply)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
