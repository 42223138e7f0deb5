"""Questions for a worker whose socket another replica holds: sent and answered through the broker.

A replica asks the workers connected to it directly (:mod:`.worker_calls`). A worker of another
replica is reached as a cancel is, on its session's command channel: the question travels in a
``question`` command naming the asker's answer channel; the replica holding the socket asks its worker
and publishes the answer there, or its failure as an answer with ``error``. Each process subscribes to
its own answer channel at its first remote question and keeps the subscription (it is made again after
a broker outage ended it). A question whose answer does not come within its timeout fails, as a local
one does.

May import dispatch (events), workers (worker_calls), broker; not api, openai_api, submission or admission.
"""

from __future__ import annotations

from typing import Annotated, Literal

from loguru import logger
from pydantic import BaseModel, Field, ValidationError

from oasst_inference_server.broker import Broker, BrokerError
from oasst_inference_server.broker.reply_channel import ReplyChannel, ReplyTimeout
from oasst_inference_server.events import worker_command_channel
from oasst_inference_server.workers.worker_calls import CallFailed, WorkerCalls
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
        self._answers: ReplyChannel[Tokenized | Detokenized] = ReplyChannel(broker, "worker-answers", _answer)

    @property
    def channel(self) -> str:
        return self._answers.channel

    async def ask(
        self, session_id: str, question: Tokenize | Detokenize, timeout: float
    ) -> Tokenized | Detokenized:
        """The answer of the worker of ``session_id`` (on any replica); raises :class:`CallFailed`."""
        command = RemoteQuestion(reply_to=self.channel, timeout=timeout, question=question)
        try:
            reply = await self._answers.request(
                worker_command_channel(session_id), question.request_id, command.model_dump_json(), timeout
            )
        except ReplyTimeout:
            raise CallFailed(f"no answer from worker {session_id} within {timeout:g}s") from None
        except BrokerError as exc:
            raise CallFailed(f"the question could not be sent: {exc}") from None
        if reply.error is not None:
            raise CallFailed(f"the worker could not answer: {reply.error}")
        return reply

    async def close(self) -> None:
        await self._answers.close()


def _answer(data: str) -> tuple[str, Tokenized | Detokenized] | None:
    try:
        reply = parse_worker_frame(data)
    except ProtocolError:
        return None
    if isinstance(reply, (Tokenized, Detokenized)):
        return reply.request_id, reply
    return None
