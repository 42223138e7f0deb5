"""The Responses API's serving object: one call per route of ``/v1/responses`` (create, retrieve or
resume the stream, cancel, delete, list the input items), on :class:`.service.ResponsesService`."""

from __future__ import annotations

from typing import Any, Literal

from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.openai_api.openai_service import IsDisconnected
from oasst_inference_server.openai_api.served import Answer, EventStream
from oasst_inference_server.openai_api.stream_resume import holding
from oasst_inference_server.responses_api.objects import response_object
from oasst_inference_server.responses_api.service import ResponsesService
from oasst_inference_server.responses_api.streaming import stream_response
from oasst_inference_server.responses_api.wire import ResponsesRequest
from oasst_inference_server.streams.reader_slots import acquire_reader


class ResponsesServing:
    def __init__(self, service: ResponsesService) -> None:
        self.service = service

    async def create(
        self, session: AsyncSession, caller: Caller, body: ResponsesRequest, is_disconnected: IsDisconnected
    ) -> Answer[dict[str, Any]] | EventStream:
        """Answer the input: its typed events (``stream``, with ``X-Request-Id``), the response queued
        (``background``), or the answered response."""
        service = self.service
        message, stored = await service.create(session, caller, body)
        await session.close()  # do not hold a database connection while the answer is generated
        if body.stream:
            events = stream_response(
                service.openai,
                message,
                service.event_sequence(message, stored),
                starting_after=None,
                cancel_on_leave=not body.background,
                is_disconnected=is_disconnected,
            )
            return EventStream(events, {"X-Request-Id": message.id})
        if body.background:
            return Answer(service.object_of(message, stored))
        final = await service.openai.wait(message, is_disconnected)
        return Answer(response_object(final, message.model_config_name or body.model, stored))

    async def retrieve(
        self,
        caller: Caller,
        response: str,
        *,
        stream: bool,
        starting_after: int | None,
        is_disconnected: IsDisconnected,
    ) -> Answer[dict[str, Any]] | EventStream:
        """The response as it is now; with ``stream`` its events after ``starting_after``, following it
        to the end (one of the caller's event-stream readers, as on the chat API)."""
        service = self.service
        message, stored = await service.get(caller, response)
        if not stream:
            return Answer(service.object_of(message, stored))
        lease = await acquire_reader(service.openai.broker, service.settings, caller.user.id, message.id)
        events = stream_response(
            service.openai,
            message,
            service.event_sequence(message, stored),
            starting_after=starting_after,
            cancel_on_leave=False,
            is_disconnected=is_disconnected,
        )
        return EventStream(holding(lease, events), {"X-Request-Id": message.id})

    async def cancel(self, caller: Caller, response: str) -> dict[str, Any]:
        return await self.service.cancel(caller, response)

    async def delete(self, caller: Caller, response: str) -> dict[str, Any]:
        await self.service.delete(caller, response)
        return {"id": response, "object": "response", "deleted": True}

    async def input_items(
        self,
        caller: Caller,
        response: str,
        *,
        limit: int,
        order: Literal["asc", "desc"],
        after: str | None,
    ) -> dict[str, Any]:
        """A page of the response's input items (newest first unless ``order="asc"``), ``limit`` at a
        time after the item ``after``."""
        items = await self.service.input_items(caller, response)
        if order == "desc":
            items = items[::-1]
        if after is not None:
            ids = [item.get("id") for item in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
