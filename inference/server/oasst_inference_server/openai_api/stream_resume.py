"""Resuming a ``/v1`` stream: ``GET /v1/chat/completions/{id}/stream`` (and ``/v1/completions``) with
``Last-Event-ID``.

The answer's events live in the broker, so any replica can serve the rest of a stream another replica
started, also after that replica is gone. A resumed reader holds a reader slot of the user's and of the
message's, as the chat API's event streams do (bounded, ``RateLimited`` past them); its slot is also what
tells an abandoned stream's grace (:meth:`OpenAIService.settle`) that somebody came back.

Only the owner resumes (anybody else's id is ``NotFound``). A stream that is gone (expired some time
after its end: ``stream_ttl_seconds``) or lost events the client has not seen (trimmed) is ``NotFound``
too: its text is no longer kept anywhere.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from datetime import timezone

from oasst_inference_server import events
from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.broker import BrokerError, parse_stream_id
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.domain_errors import NotFound
from oasst_inference_server.openai_api.openai_service import IsDisconnected, OpenAIService
from oasst_inference_server.openai_api.openai_streams import ChatChunks, CompletionChunks, stream_answer
from oasst_inference_server.openai_api.stream_positions import (
    ChunkIds,
    Position,
    parse_completion_id,
    parse_last_event_id,
)
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.reader_slots import ReaderLease, acquire_reader
from oasst_shared.schemas import MessageState


async def resume_stream(
    service: OpenAIService,
    settings: Settings,
    caller: Caller,
    completion_id: str,
    *,
    chat: bool,
    last_event_id: str | None,
    include_usage: bool,
    is_disconnected: IsDisconnected,
) -> AsyncGenerator[str, None]:
    """The chunks after ``last_event_id`` (all of them without one) of the caller's stream
    ``completion_id``. Everything that can refuse the request is checked before this returns."""
    message_id = parse_completion_id(completion_id, "chatcmpl" if chat else "cmpl")
    after = parse_last_event_id(last_event_id, completion_id) if last_event_id is not None else None
    message = await service.own_request(caller, message_id)
    if message is None:
        raise NotFound("completion_not_found", f"no stream {completion_id} of yours", param="id")
    await _check_stream_kept(service, message, completion_id, after)
    lease = await acquire_reader(service.broker, settings, caller.user.id, message.id)
    make = ChatChunks if chat else CompletionChunks
    created = message.created_at
    if created.tzinfo is None:  # SQLite gives back naive UTC times
        created = created.replace(tzinfo=timezone.utc)
    chunks = make(completion_id, int(created.timestamp()), message.model_config_name or "")
    stream = stream_answer(
        service,
        message,
        chunks,
        include_usage=include_usage,
        is_disconnected=is_disconnected,
        ids=ChunkIds(completion_id, after),
    )
    return holding(lease, stream)


async def holding(lease: ReaderLease, events: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    """``events`` while holding the reader's slots (the chat API's bound on open event streams); they
    are given back when the stream ends (``ReaderLease.held``)."""
    async with lease.held(), aclosing(events) as stream:
        async for chunk in stream:
            yield chunk


async def _check_stream_kept(
    service: OpenAIService, message: DbMessage, completion_id: str, after: Position | None
) -> None:
    stream = events.stream_name(message.id)
    try:
        exists = await service.broker.stream_exists(stream)
        first_kept = await service.broker.first_kept_if_trimmed(stream) if exists else None
    except BrokerError:
        return  # the reader follows the database until the broker is back
    if not exists and MessageState(message.state).is_terminal:
        raise NotFound(
            "stream_expired",
            f"the stream of {completion_id} has expired: its events are kept only a while after its end",
            param="id",
        )
    if first_kept is not None and (after is None or after.entry < parse_stream_id(first_kept)):
        raise NotFound(
            "stream_trimmed",
            f"the stream of {completion_id} no longer holds every event after that id",
            param="Last-Event-ID",
        )
