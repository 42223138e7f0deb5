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

from oasst_inference_server.api.deps import CurrentUser, LifecycleDep, SessionDep
from oasst_inference_server.api.responses import AUTH, CHAT, MESSAGE, Responses, error
from oasst_inference_server.chats.chat_feedback import (
    evaluate_answer,
    hide_user_chats,
    report_answer,
    update_chat,
    vote_on_answer,
)
from oasst_inference_server.chats.chat_store import delete_chat, get_own_chat, to_chat_list_read
from oasst_shared.schemas import (
    ChatListRead,
    ChatUpdateRequest,
    MessageEvalRequest,
    ReportRequest,
    VoteRequest,
)

router = APIRouter(prefix="/chats", tags=["chats"])

_NOT_ASSISTANT: Responses = {400: error("Only assistant messages take this feedback")}


# Declared before /{chat_id} so "hide_all" is not taken for a chat id.
@router.put("/hide_all", status_code=204, responses=AUTH)
@router.post("/hide_all", status_code=204, responses=AUTH)
async def hide_all_chats(user: CurrentUser, session: SessionDep) -> Response:
    """Hide every chat of the user (they stay readable and are listed with ``include_hidden``)."""
    await hide_user_chats(session, user)
    return Response(status_code=204)


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
    return to_chat_list_read(await update_chat(session, user, chat_id, body))


@router.patch("/{chat_id}", response_model=ChatListRead, responses=_UPDATE_ERRORS)
async def patch_chat(
    chat_id: str, body: ChatUpdateRequest, user: CurrentUser, session: SessionDep
) -> ChatListRead:
    """The same as ``PUT``: only the fields given change."""
    return to_chat_list_read(await update_chat(session, user, chat_id, body))


@router.delete("/{chat_id}", status_code=204, responses=CHAT)
async def delete_own_chat(
    chat_id: str, user: CurrentUser, session: SessionDep, lifecycle: LifecycleDep
) -> Response:
    """Delete the chat, its messages and their feedback; its running answers are cancelled first."""
    chat = await get_own_chat(session, user, chat_id)
    await delete_chat(session, lifecycle, chat)
    return Response(status_code=204)


@router.post(
    "/{chat_id}/messages/{message_id}/votes",
    status_code=204,
    responses={**MESSAGE, **_NOT_ASSISTANT, 422: error("score must be -1, 0 or 1")},
)
async def vote(
    chat_id: str, message_id: str, body: VoteRequest, user: CurrentUser, session: SessionDep
) -> Response:
    """Rate an answer: 1 good, -1 bad, 0 clears the vote (shown as the message's ``score``)."""
    await vote_on_answer(session, user, chat_id, message_id, body.score)
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
    await report_answer(session, user, chat_id, message_id, body.report_type.value, body.reason)
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
    await evaluate_answer(session, user, chat_id, message_id, body.inferior_message_ids)
    return Response(status_code=204)
