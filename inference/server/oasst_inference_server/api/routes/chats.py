from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request

from oasst_inference_server.admission.limits import check_chat_capacity, check_message_length
from oasst_inference_server.admission.request_bounds import check_chat_count
from oasst_inference_server.api.deps import (
    BrokerDep,
    CurrentUser,
    LifecycleDep,
    MessageReadsDep,
    SchedulingDep,
    SessionDep,
    SettingsDep,
    StreamFanoutDep,
    SubmissionDep,
)
from oasst_inference_server.api.served import EventStreamResponse
from oasst_inference_server.broker import is_stream_id
from oasst_inference_server.chats.chat_store import (
    add_prompter_message,
    chat_read,
    create_user_chat,
    get_chat_message,
    get_own_chat,
    get_own_chat_message,
    list_user_chats,
    message_read_with_feedback,
    to_chat_list_read,
)
from oasst_inference_server.db.models import new_id
from oasst_inference_server.domain_errors import InvalidRequest, InvalidValue
from oasst_inference_server.events import to_message_read
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.event_reader import read_message_events
from oasst_inference_server.streams.reader_slots import ReaderLease, acquire_reader
from oasst_inference_server.streams.sse import SseEvent, encode_sse
from oasst_shared.schemas import (
    ChatRead,
    CreateAssistantMessageRequest,
    CreateChatRequest,
    CreatedEvent,
    CreatePrompterMessageRequest,
    CreateTurnRequest,
    ErrorBody,
    ListChatsResponse,
    MessageRead,
    Role,
)

router = APIRouter(prefix="/chats", tags=["chats"])

_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Not authenticated"},
}
_ID_ERRORS: dict[int | str, dict[str, Any]] = {
    **_AUTH_ERRORS,
    404: {"model": ErrorBody, "description": "No such chat or message for this user"},
}


@router.post(
    "",
    response_model=ChatRead,
    responses={
        **_AUTH_ERRORS,
        409: {"model": ErrorBody, "description": "The user has max_chats_per_user chats"},
    },
)
async def create_chat(
    user: CurrentUser, session: SessionDep, settings: SettingsDep, body: CreateChatRequest | None = None
) -> ChatRead:
    await check_chat_count(session, settings, user.id)
    chat = await create_user_chat(session, user, body.title if body else None)
    return ChatRead(**to_chat_list_read(chat).model_dump())


@router.get(
    "",
    response_model=ListChatsResponse,
    responses={**_AUTH_ERRORS, 400: {"model": ErrorBody, "description": "Invalid cursor"}},
)
async def list_chats(
    user: CurrentUser,
    session: SessionDep,
    include_hidden: bool = False,
    limit: Annotated[int, Query(gt=0, le=100)] = 10,
    after: Annotated[str | None, Query(max_length=200, description="The `next` cursor of a page")] = None,
    before: Annotated[str | None, Query(max_length=200, description="The `prev` cursor of a page")] = None,
) -> ListChatsResponse:
    """The user's chats, newest first, a page at a time: pass ``next`` as ``after`` for older chats,
    ``prev`` as ``before`` for newer ones."""
    chats, next_cursor, prev_cursor = await list_user_chats(
        session, user, include_hidden=include_hidden, limit=limit, after=after, before=before
    )
    return ListChatsResponse(chats=[to_chat_list_read(c) for c in chats], next=next_cursor, prev=prev_cursor)


@router.get("/{chat_id}", response_model=ChatRead, responses=_ID_ERRORS)
async def get_chat(chat_id: str, user: CurrentUser, session: SessionDep) -> ChatRead:
    chat = await get_own_chat(session, user, chat_id)
    return await chat_read(session, chat)


@router.post(
    "/{chat_id}/prompter_message",
    response_model=MessageRead,
    responses={
        **_ID_ERRORS,
        400: {"model": ErrorBody, "description": "Bad parent message"},
        409: {"model": ErrorBody, "description": "The chat has reached max_messages_per_chat"},
        422: {"model": ErrorBody, "description": "Empty or too long message"},
    },
)
async def create_prompter_message(
    chat_id: str,
    body: CreatePrompterMessageRequest,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
) -> MessageRead:
    """Add the user's message, as the first message of the chat or as a reply to an assistant message."""
    chat = await get_own_chat(session, user, chat_id)
    if not body.content.strip():
        raise InvalidValue("empty_message", "the message is empty")
    check_message_length(settings, body.content)
    size = await check_chat_capacity(session, settings, chat.id)
    message = await add_prompter_message(session, chat, body.parent_id, body.content, size=size)
    return to_message_read(message)


# What asking for an answer can meet (the assistant_message and turns routes).
_ANSWER_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ID_ERRORS,
    400: {"model": ErrorBody, "description": "Bad parent message or unknown model"},
    429: {"model": ErrorBody, "description": "Rate or concurrency limit reached (see Retry-After)"},
    409: {"model": ErrorBody, "description": "The chat has reached max_messages_per_chat"},
    422: {"model": ErrorBody, "description": "Invalid request, or a system prompt over its limit"},
    503: {"model": ErrorBody, "description": "No worker serves the model, or its queue is full"},
}


@router.post(
    "/{chat_id}/assistant_message",
    response_model=MessageRead,
    responses=_ANSWER_ERRORS,
)
async def create_assistant_message(
    chat_id: str,
    body: CreateAssistantMessageRequest,
    user: CurrentUser,
    session: SessionDep,
    submission: SubmissionDep,
    scheduling: SchedulingDep,
) -> MessageRead:
    """Queue an answer to a prompter message; stream it from ``.../messages/{id}/events``."""
    message = await submission.answer_in_chat(session, user, chat_id, body, scheduling)
    return to_message_read(message)


@router.post(
    "/{chat_id}/turns",
    response_class=EventStreamResponse,
    responses={
        **_ANSWER_ERRORS,
        200: {
            "content": {"text/event-stream": {}},
            "description": "A `created` event with both messages, then the answer's events",
        },
        422: {"model": ErrorBody, "description": "Empty or too long message, or an invalid request"},
    },
)
async def create_turn(
    request: Request,
    chat_id: str,
    body: CreateTurnRequest,
    user: CurrentUser,
    session: SessionDep,
    submission: SubmissionDep,
    scheduling: SchedulingDep,
    broker: BrokerDep,
    fanout: StreamFanoutDep,
    reads: MessageReadsDep,
    settings: SettingsDep,
) -> EventStreamResponse:
    """One call for a turn: add the user's message, queue the answer and stream it.

    The same as ``prompter_message``, ``assistant_message`` and ``.../events`` in a row, in one round
    trip, and both messages are created or neither. The stream starts with a ``created`` event holding
    the two messages; if it breaks, resume it from ``.../messages/{assistant id}/events`` with
    ``Last-Event-ID``. Refusals (limits, unknown model...) are ordinary JSON errors, before any event.
    """
    # The reader's slots first: a turn whose answer could not be read is refused before it is created.
    answer_id = new_id()
    lease = await acquire_reader(broker, settings, user.id, answer_id)
    try:
        prompt, answer = await submission.turn_in_chat(session, user, chat_id, body, scheduling, answer_id)
    except BaseException:
        await lease.release()
        raise
    created = CreatedEvent(
        prompter_message=to_message_read(prompt), assistant_message=to_message_read(answer)
    )
    await session.close()  # do not hold a database connection for the life of the stream
    batches = read_message_events(reads, fanout, settings, answer, None, request.is_disconnected)
    return _event_stream(_encoded(batches, lease, first=[{"data": created.model_dump_json()}]), settings)


@router.get("/{chat_id}/messages/{message_id}", response_model=MessageRead, responses=_ID_ERRORS)
async def get_message(chat_id: str, message_id: str, user: CurrentUser, session: SessionDep) -> MessageRead:
    chat = await get_own_chat(session, user, chat_id)
    return await message_read_with_feedback(session, await get_chat_message(session, chat, message_id))


@router.post("/{chat_id}/messages/{message_id}/cancel", response_model=MessageRead, responses=_ID_ERRORS)
async def cancel_message(
    chat_id: str, message_id: str, user: CurrentUser, session: SessionDep, lifecycle: LifecycleDep
) -> MessageRead:
    """Stop generating: a pending message ends at once, a running one after its worker stops."""
    chat = await get_own_chat(session, user, chat_id)
    message = await get_chat_message(session, chat, message_id)
    await lifecycle.request_cancel(message)
    refreshed = await lifecycle.get(message.id)
    assert refreshed is not None
    return to_message_read(refreshed)


@router.get(
    "/{chat_id}/messages/{message_id}/events",
    responses={
        **_ID_ERRORS,
        200: {"content": {"text/event-stream": {}}, "description": "Server-sent events of the message"},
        400: {"model": ErrorBody, "description": "Not an assistant message, or a bad Last-Event-ID"},
        429: {"model": ErrorBody, "description": "Too many open event streams for the user or the message"},
    },
)
async def message_events(
    request: Request,
    chat_id: str,
    message_id: str,
    user: CurrentUser,
    session: SessionDep,
    broker: BrokerDep,
    fanout: StreamFanoutDep,
    reads: MessageReadsDep,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventStreamResponse:
    """Stream ``pending``, ``token`` and ``retry`` events, then one ``message`` or ``error`` event.

    Every stored event carries an id; reconnect with ``Last-Event-ID`` to get the rest, once.
    """
    message = await get_own_chat_message(session, user, chat_id, message_id)
    if last_event_id is not None and not is_stream_id(last_event_id):
        raise InvalidRequest(
            "invalid_last_event_id", f"Last-Event-ID {last_event_id[:40]!r} is not an event id"
        )
    if message.role != Role.assistant:
        raise InvalidRequest("not_assistant_message", "only assistant messages have events")
    lease = await acquire_reader(broker, settings, user.id, message.id)
    await session.close()  # do not hold a database connection for the life of the stream
    batches = read_message_events(reads, fanout, settings, message, last_event_id, request.is_disconnected)
    return _event_stream(_encoded(batches, lease), settings)


def _event_stream(body: AsyncGenerator[bytes, None], settings: Settings) -> EventStreamResponse:
    # Cache-Control no-cache, not no-store: the events are private either way (the request carries
    # Authorization, which shared caches must not store), and Chromium reports a streamed no-store
    # response read to its end as an aborted request, which the web page's tests forbid.
    return EventStreamResponse(body, keep_alive=settings.sse_ping_interval)


async def _encoded(
    batches: AsyncGenerator[list[SseEvent], None], lease: ReaderLease, first: list[SseEvent] | None = None
) -> AsyncGenerator[bytes, None]:
    # One write per batch: a reader that fell behind catches up in one send, not one per token.
    async with lease.held(), aclosing(batches) as stream:
        if first:
            yield encode_sse(first)
        async for batch in stream:
            yield encode_sse(batch)
