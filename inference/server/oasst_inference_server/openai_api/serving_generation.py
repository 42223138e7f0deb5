"""What ``/v1/chat/completions`` and ``/v1/completions`` share (vLLM's ``OpenAIServing``): admit the
request, queue one job per choice, then stream the chunks or wait for every answer; and resume a stream.

The serving objects of the two endpoints (:mod:`.serving_chat`, :mod:`.serving_completions`) say how a
request is queued and how its answers make a response.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Sequence
from typing import ClassVar, Generic, TypeVar

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.openai_api.openai_service import IsDisconnected, OpenAIService
from oasst_inference_server.openai_api.openai_streams import (
    ChatChunks,
    CompletionChunks,
    stream_answer,
    stream_choices,
)
from oasst_inference_server.openai_api.request_admission import admit
from oasst_inference_server.openai_api.served import Answer, EventStream
from oasst_inference_server.openai_api.stream_positions import ChunkIds
from oasst_inference_server.openai_api.stream_resume import resume_stream
from oasst_inference_server.openai_protocol.generation_requests import (
    ChatCompletionRequest,
    CompletionRequest,
)
from oasst_inference_server.openai_protocol.generation_responses import (
    ChatCompletionResponse,
    CompletionResponse,
)
from oasst_inference_server.openai_protocol.usage import GenerationUsage
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_shared.logprobs import TokenLogprob
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import MessageRead

RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)
ResponseT = TypeVar("ResponseT", ChatCompletionResponse, CompletionResponse)
# A choice's answer, and its token logprobs when they were asked for.
ChoiceAnswer = tuple[MessageRead, list[TokenLogprob] | None]


def sampling_of_choice(sampling: SamplingParameters, index: int) -> SamplingParameters:
    # Several choices with one seed would be the same answer n times: each gets its own seed.
    if index == 0 or sampling.seed is None:
        return sampling
    return sampling.model_copy(update={"seed": (sampling.seed + index) % 2**64})


async def wait_for_answers(
    service: OpenAIService, messages: list[DbMessage], is_disconnected: IsDisconnected, logprobs: bool
) -> list[ChoiceAnswer]:
    """Every message's answer (and logprobs), waited for together; the first failure cancels the rest."""
    results: list[ChoiceAnswer | None] = [None] * len(messages)

    async def one(index: int, message: DbMessage) -> None:
        collected: list[TokenLogprob] | None = [] if logprobs else None
        results[index] = (await service.wait(message, is_disconnected, collected), collected)

    tasks = [asyncio.ensure_future(one(index, message)) for index, message in enumerate(messages)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()  # after a failure: the other choices stop (their waits cancel their jobs)
        await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if r is not None]


class GenerationServing(ABC, Generic[RequestT, ResponseT]):
    """One generation endpoint: ``create`` answers a request, ``resume`` the rest of a stream."""

    chat: ClassVar[bool]  # chat completions (``chatcmpl-`` ids, chat chunks), or completions

    def __init__(self, service: OpenAIService) -> None:
        self.service = service

    @abstractmethod
    async def _submit(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        choices: Sequence[SamplingParameters],
        body: RequestT,
    ) -> list[DbMessage]:
        """Queue the request, one message per choice (each with its sampling)."""

    @abstractmethod
    def _response(
        self,
        completion_id: str,
        created: int,
        model: str,
        answers: list[ChoiceAnswer],
        usage: GenerationUsage,
    ) -> ResponseT:
        """The whole answer, from every choice's."""

    async def create(
        self, session: AsyncSession, caller: Caller, body: RequestT, is_disconnected: IsDisconnected
    ) -> Answer[ResponseT] | EventStream:
        """Queue the request (one job per choice), then stream its chunks (``stream``) or answer when
        every choice is done. ``X-Request-Id``: the choices' message ids."""
        admitted = await admit(self.service, body)
        # One job per choice, admitted together: the limits count all of them.
        choices = [sampling_of_choice(admitted.sampling, index) for index in range(body.choices)]
        messages = await self._submit(session, caller, admitted.model, choices, body)
        await session.close()  # do not hold a database connection while the answer is generated
        completion_id = f"{'chatcmpl' if self.chat else 'cmpl'}-{messages[0].id}"
        created, name = int(messages[0].created_at.timestamp()), admitted.model.config.name
        headers = {"X-Request-Id": ",".join(m.id for m in messages)}
        if body.stream:
            events = self._stream(messages, completion_id, created, name, body.include_usage, is_disconnected)
            return EventStream(events, headers)
        answers = await wait_for_answers(self.service, messages, is_disconnected, body.wants_logprobs()[0])
        await self.service.refuse_moderated([final for final, _ in answers])
        usage = GenerationUsage.of_answers([final for final, _ in answers])
        return Answer(self._response(completion_id, created, name, answers, usage), headers)

    def _stream(
        self,
        messages: list[DbMessage],
        completion_id: str,
        created: int,
        name: str,
        include_usage: bool,
        is_disconnected: IsDisconnected,
    ) -> AsyncGenerator[str, None]:
        make = ChatChunks if self.chat else CompletionChunks
        if len(messages) > 1:
            return stream_choices(
                self.service,
                messages,
                [make(completion_id, created, name, index) for index in range(len(messages))],
                include_usage=include_usage,
                is_disconnected=is_disconnected,
            )
        return stream_answer(
            self.service,
            messages[0],
            make(completion_id, created, name),
            include_usage=include_usage,
            is_disconnected=is_disconnected,
            ids=ChunkIds(completion_id, None),
        )

    async def resume(
        self,
        caller: Caller,
        completion_id: str,
        *,
        last_event_id: str | None,
        include_usage: bool,
        is_disconnected: IsDisconnected,
    ) -> EventStream:
        """The rest of the caller's stream ``completion_id`` after ``last_event_id`` (:mod:`.stream_resume`)."""
        events = await resume_stream(
            self.service,
            self.service.settings,
            caller,
            completion_id,
            chat=self.chat,
            last_event_id=last_event_id,
            include_usage=include_usage,
            is_disconnected=is_disconnected,
        )
        return EventStream(events)
