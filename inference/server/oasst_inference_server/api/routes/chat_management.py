"""Managing chats: update (title, hidden, data use, active thread), delete, hide all, and feedback on
messages (votes, reports, evaluations). Route shapes follow the original Open-Assistant server.

Branching: a chat is a tree. A prompter message answers an assistant message (or is the root); an
assistant message answers a prompter message. Several answers to one prompt ("regenerate") and
several prompts under one answer ("edit") are siblings. **Branching never cancels anything**: a new
sibling leaves the others running. Messages are cancelled only explicitly (``.../cancel``), when
their chat is deleted, or when the account is deleted. ``active_thread_tail_message_id`` records
which branch the user looks at; it follows the newest message and can be set with ``PUT``.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from sqlalchemy import select, update

from oasst_inference_server.api.deps import CurrentUser, LifecycleDep, SessionDep
from oasst_inference_server.api.responses import AUTH, CHAT, MESSAGE, Responses, error
from oasst_inference_server.chats.chat_store import (
    delete_chat,
    get_chat_message,
    get_own_chat,
    to_chat_list_read,
)
from oasst_inference_server.db.models import DbChat, DbMessage, DbMessageEvaluation, DbReport, utcnow
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_shared.schemas import (
    ChatListRead,
    ChatUpdateRequest,
    MessageEvalRequest,
    ReportRequest,
    Role,
    VoteRequest,
)

router = APIRouter(prefix="/chats", tags=["chats"])

_NOT_ASSISTANT: Responses = {400: error("Only assistant messages take this feedback")}


# Declared before /{chat_id} so "hide_all" is not taken for a chat id.
@router.put("/hide_all", status_code=204, responses=AUTH)
@router.post("/hide_all", status_code=204, responses=AUTH)
async def hide_all_chats(user: CurrentUser, session: SessionDep) -> Response:
    """Hide every chat of the user (they stay readable and are listed with ``include_hidden``)."""
    await session.exec(
        update(DbChat).where(DbChat.user_id == user.id, DbChat.hidden == False).values(hidden=True)  # noqa: E712
    )
    await session.commit()
    return Response(status_code=204)


async def _update_chat(
    chat_id: str, body: ChatUpdateRequest, user: CurrentUser, session: SessionDep
) -> ChatListRead:
    chat = await get_own_chat(session, user, chat_id)
    changes = body.model_dump(exclude_unset=True)
    if "title" in changes:
        title = (body.title or "").strip()
        chat.title = title or None
    if body.hidden is not None:
        chat.hidden = body.hidden
    if body.allow_data_use is not None:
        chat.allow_data_use = body.allow_data_use
    if body.active_thread_tail_message_id is not None:
        tail = await session.get(DbMessage, body.active_thread_tail_message_id)
        if tail is None or tail.chat_id != chat.id:
            raise InvalidRequest(
                "message_not_in_chat", "active_thread_tail_message_id is not a message of this chat"
            )
        chat.active_thread_tail_message_id = tail.id
    chat.modified_at = utcnow()
    session.add(chat)
    await session.commit()
    return to_chat_list_read(chat)


_UPDATE_ERRORS = {
    **CHAT,
    400: error("The active thread tail is not a message of this chat"),
    422: error("Invalid fields"),
}


@router.put("/{chat_id}", response_model=ChatListRead, responses=_UPDATE_ERRORS)
async def put_chat(
    chat_id: str, body: ChatUpdateRequest, user: CurrentUser, session: SessionDep
) -> ChatListRead:
    """Change the title, hidden flag, data-use consent or active thread; omitted fields stay."""
    return await _update_chat(chat_id, body, user, session)


@router.patch("/{chat_id}", response_model=ChatListRead, responses=_UPDATE_ERRORS)
async def patch_chat(
    chat_id: str, body: ChatUpdateRequest, user: CurrentUser, session: SessionDep
) -> ChatListRead:
    """The same as ``PUT``: only the fields given change."""
    return await _update_chat(chat_id, body, user, session)


@router.delete("/{chat_id}", status_code=204, responses=CHAT)
async def delete_own_chat(
    chat_id: str, user: CurrentUser, session: SessionDep, lifecycle: LifecycleDep
) -> Response:
    """Delete the chat, its messages and their feedback; its running answers are cancelled first."""
    chat = await get_own_chat(session, user, chat_id)
    await delete_chat(session, lifecycle, chat)
    return Response(status_code=204)


async def _own_answer(
    session: SessionDep, user: CurrentUser, chat_id: str, message_id: str, action: str
) -> tuple[DbChat, DbMessage]:
    """The user's chat and one of its assistant messages (feedback is only for answers)."""
    chat = await get_own_chat(session, user, chat_id)
    message = await get_chat_message(session, chat, message_id)
    if message.role != Role.assistant:
        raise InvalidRequest("not_assistant_message", f"only assistant messages can be {action}")
    return chat, message


@router.post(
    "/{chat_id}/messages/{message_id}/votes",
    status_code=204,
    responses={**MESSAGE, **_NOT_ASSISTANT, 422: error("score must be -1, 0 or 1")},
)
async def vote(
    chat_id: str, message_id: str, body: VoteRequest, user: CurrentUser, session: SessionDep
) -> Response:
    """Rate an answer: 1 good, -1 bad, 0 clears the vote (shown as the message's ``score``)."""
    _, message = await _own_answer(session, user, chat_id, message_id, "voted on")
    message.score = body.score
    session.add(message)
    await session.commit()
    return Response(status_code=204)


@router.post(
    "/{chat_id}/messages/{message_id}/reports",
    status_code=204,
    responses={**MESSAGE, **_NOT_ASSISTANT, 422: error("Unknown report_type or too long reason")},
)
async def report(
    chat_id: str, message_id: str, body: ReportRequest, user: CurrentUser, session: SessionDep
) -> Response:
    """Report an answer as spam, offensive, or with feedback (listed in the message's ``reports``)."""
    _, message = await _own_answer(session, user, chat_id, message_id, "reported")
    session.add(
        DbReport(
            message_id=message.id, user_id=user.id, report_type=body.report_type.value, reason=body.reason
        )
    )
    await session.commit()
    return Response(status_code=204)


@router.post(
    "/{chat_id}/messages/{message_id}/message_evals",
    status_code=204,
    responses={
        **MESSAGE,
        400: error("The messages are not sibling answers of this chat"),
        422: error("inferior_message_ids is empty or too long"),
    },
)
async def evaluate(
    chat_id: str, message_id: str, body: MessageEvalRequest, user: CurrentUser, session: SessionDep
) -> Response:
    """Record that this answer is better than ``inferior_message_ids``, other answers to the same prompt."""
    chat, selected = await _own_answer(session, user, chat_id, message_id, "evaluated")
    inferior = set(body.inferior_message_ids)
    if selected.id in inferior:
        raise InvalidRequest("invalid_evaluation", "a message cannot be inferior to itself")
    siblings = set(
        (
            await session.exec(
                select(DbMessage.id).where(
                    DbMessage.chat_id == chat.id,
                    DbMessage.parent_id == selected.parent_id,
                    DbMessage.role == Role.assistant,
                )
            )
        ).scalars()
    )
    strangers = sorted(inferior - siblings)
    if strangers:
        raise InvalidRequest(
            "invalid_evaluation",
            f"not other answers to the same prompt in this chat: {', '.join(strangers)}",
        )
    session.add(
        DbMessageEvaluation(
            chat_id=chat.id,
            user_id=user.id,
            selected_message_id=selected.id,
            inferior_message_ids=sorted(inferior),
        )
    )
    await session.commit()
    return Response(status_code=204)
