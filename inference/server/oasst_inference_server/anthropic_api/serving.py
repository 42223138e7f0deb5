"""The Messages API's serving object: one call per route (``POST /v1/messages``, ``POST
/v1/messages/count_tokens``), on :class:`.anthropic_service.AnthropicService`."""

from __future__ import annotations

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.anthropic_api.anthropic_service import AnthropicService
from oasst_inference_server.anthropic_api.anthropic_streams import stream_message
from oasst_inference_server.anthropic_api.conversion import message_id, to_message
from oasst_inference_server.anthropic_api.schemas import (
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
)
from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.openai_api.openai_service import IsDisconnected
from oasst_inference_server.openai_api.served import Answer, EventStream


class AnthropicServing:
    def __init__(self, service: AnthropicService) -> None:
        self.service = service

    async def create(
        self, session: AsyncSession, caller: Caller, body: MessagesRequest, is_disconnected: IsDisconnected
    ) -> Answer[MessageResponse] | EventStream:
        """The answer (its server-sent events with ``stream``); ``request-id`` and ``X-Request-Id`` name
        the request either way."""
        submitted = await self.service.submit(session, caller, body)
        await session.close()  # do not hold a database connection while the answer is generated
        request_id = {"request-id": message_id(submitted.message.id), "X-Request-Id": submitted.message.id}
        if body.stream:
            return EventStream(stream_message(self.service, submitted, is_disconnected), request_id)
        final = await self.service.wait(submitted, is_disconnected)
        return Answer(to_message(final, submitted.model.config.name, body), request_id)

    async def count_tokens(
        self, session: AsyncSession, caller: Caller, body: CountTokensRequest
    ) -> CountTokensResponse:
        """The prompt's tokens; ``session`` (the caller's, already checked) is closed first: no database
        connection is held while a worker counts."""
        await session.close()
        return CountTokensResponse(input_tokens=await self.service.count_tokens(caller, body))
