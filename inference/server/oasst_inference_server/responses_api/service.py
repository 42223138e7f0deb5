"""Serving the Responses API on the ``/v1`` path: one message per response.

A request is checked and converted to a chat-completions request (:mod:`.wire`), so the bounds, sampling,
output schemas, capabilities, prompt fit, admission (limits, queue, fair tickets) and usage are those of
``/v1/chat/completions`` (:class:`~oasst_inference_server.openai_api.openai_service.OpenAIService`).

* ``store`` (the default): the message has ``kind`` "response" and is kept: the input's user and
  assistant messages and the answer are a chat of the user (the answer's parent is the newest input
  turn; with ``previous_response_id``, the first new turn's parent is the previous response), and the
  request the worker needs (the whole conversation, tools) is kept with the message, so a later
  response continues from it. Only its owner can read, cancel or delete it (404 for anyone else).
* ``store: false``: the message is an ordinary ``/v1`` completion (``kind`` "completion"), erased once
  answered as the operator's ``store_api_conversations`` says, and cannot be retrieved.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError
from sqlalchemy import null, update
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.chats.chat_store import title_from_prompt
from oasst_inference_server.db.models import DbChat, DbMessage, MessageKind
from oasst_inference_server.db.payloads import RequestPayload, read_request, read_result
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.domain_errors import InvalidRequest, NotFound
from oasst_inference_server.events import to_message_read
from oasst_inference_server.openai_api.openai_service import OpenAIService, answer_in_chat
from oasst_inference_server.openai_api.request_admission import admit
from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_inference_server.responses_api.event_sequence import ResponseEventSequence
from oasst_inference_server.responses_api.objects import (
    RESPONSE_KIND,
    ResponseStatus,
    StoredRequest,
    message_id_of,
    response_object,
)
from oasst_inference_server.responses_api.wire import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    ResponsesRequest,
    chat_messages_of,
)
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import MessageRead, MessageState

# A deleted response's message: its content erased, its usage kept.
DELETED_KIND = MessageKind.response_deleted
_CANCEL_WAIT_SECONDS = 5.0


def _invalid(exc: ValidationError, prefix: str = "") -> InvalidRequest:
    first = exc.errors(include_url=False)[0]
    loc = [str(p) for p in first["loc"]]
    if loc and loc[0] == "messages":  # the converted request: its messages are the input
        loc = ["input"]
    param = prefix + ".".join(loc) if loc else None
    message = str(first["msg"]).removeprefix("Value error, ")
    return InvalidRequest("invalid_value", f"{param}: {message}" if param else message, param=param)


def _as_text_format(exc: InvalidRequest) -> InvalidRequest:
    """The chat API's error about ``response_format``, naming the Responses field, ``text.format``."""
    if not (exc.param or "").startswith("response_format"):
        return exc
    param = (exc.param or "").replace("response_format.json_schema.schema", "text.format.schema")
    param = param.replace("response_format", "text.format")
    detail = exc.detail.replace("response_format.json_schema.schema", "text.format.schema")
    return InvalidRequest(exc.code, detail.replace("response_format", "text.format"), param=param)


def _turns_of(message: DbMessage) -> list[dict[str, Any]]:
    """The conversation a stored response answered, and its answer, as chat-completions messages."""
    payload = read_request(message.request_payload, what=f"response {message.id}")
    turns = [
        t.model_dump(mode="json", exclude_none=True) for t in (payload.thread if payload else None) or []
    ]
    result = read_result(message.result_payload, what=f"response {message.id}")
    answer: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if result and result.tool_calls:
        answer["tool_calls"] = [c.model_dump(mode="json") for c in result.tool_calls]
    return [*turns, answer]


def _item_record(item: InputItem, index: int, message_id: str) -> dict[str, Any]:
    """An input item as ``input_items`` lists it (with an id, if it came without one)."""
    record = item.model_dump(mode="json", exclude_none=True, by_alias=True)
    prefix = {MessageItem: "msg", FunctionCallItem: "fc", FunctionCallOutputItem: "fco"}[type(item)]
    record.setdefault("id", f"{prefix}_{message_id.replace('-', '')}_in{index}")
    if isinstance(item, MessageItem):
        content = item.content
        kind = "output_text" if item.role == "assistant" else "input_text"
        record["content"] = (
            [{"type": kind, "text": content}]
            if isinstance(content, str)
            else [{"type": p.type, "text": p.text} for p in content]
        )
        record.setdefault("status", "completed")
    return record


class ResponsesService:
    def __init__(
        self,
        settings: Settings,
        session_factory: async_sessionmaker[AsyncSession],
        lifecycle: MessageLifecycle,
        openai: OpenAIService,
    ):
        self.settings = settings
        self._sessions = session_factory
        self._lifecycle = lifecycle
        self.openai = openai

    # ------------------------------------------------------------ creating
    async def create(
        self, session: AsyncSession, caller: Caller, body: ResponsesRequest
    ) -> tuple[DbMessage, StoredRequest]:
        """Check, store and queue the response's message (not yet answered)."""
        previous = await self._previous(caller, body.previous_response_id)
        items = body.items
        messages: list[dict[str, Any]] = []
        if body.instructions:
            messages.append({"role": "system", "content": body.instructions})
        if previous is not None:
            messages += _turns_of(previous)
        messages += chat_messages_of(items)
        try:
            chat = ChatCompletionRequest.model_validate(
                {
                    "model": body.model,
                    "messages": messages,
                    "tools": body.tool_definitions(),
                    "tool_choice": body.chat_tool_choice(),
                    "response_format": body.response_format(),
                    "max_completion_tokens": body.max_output_tokens,
                    "temperature": body.temperature,
                    "top_p": body.top_p,
                    "parallel_tool_calls": body.parallel_tool_calls,
                }
            )
        except ValidationError as exc:
            raise _invalid(exc) from None
        try:
            admitted = await admit(self.openai, chat, tool_schema_param="tools[{i}].parameters")
        except InvalidRequest as exc:
            raise _as_text_format(exc) from None
        model, sampling = admitted.model, admitted.sampling
        system_prompt, thread = chat.to_thread()
        stored = StoredRequest(
            instructions=body.instructions,
            tools=[t.model_dump(mode="json", exclude_none=True, by_alias=True) for t in body.tools or []],
            tool_choice=(
                body.tool_choice.model_dump(mode="json")
                if body.tool_choice is not None and not isinstance(body.tool_choice, str)
                else body.tool_choice or "auto"
            ),
            text_format=(
                body.text.format.model_dump(mode="json", exclude_none=True, by_alias=True)
                if body.text is not None and body.text.format is not None
                else {"type": "text"}
            ),
            max_output_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            metadata=body.metadata or {},
            previous_response_id=body.previous_response_id,
            background=body.background,
            store=body.store,
            user=body.user,
        )

        def stage(session: AsyncSession, message: DbMessage) -> None:
            stored.input_items = [_item_record(item, i, message.id) for i, item in enumerate(items)]
            payload = RequestPayload.model_validate(message.request_payload or {})
            payload.response = stored.model_dump()
            message.request_payload = payload.stored()
            self._stage_in_chat(session, message, items, previous, previous_chat)

        previous_chat = (
            await session.get(DbChat, previous.chat_id) if previous is not None and previous.chat_id else None
        )
        (message,) = await self.openai.submit_chat(
            session,
            caller,
            model,
            [sampling],
            system_prompt,
            thread,
            chat.tools or None,
            chat.tool_choice,
            kind=RESPONSE_KIND if body.store else MessageKind.completion,
            stage=stage if body.store else None,
        )
        return message, stored

    async def _previous(self, caller: Caller, previous_id: str | None) -> DbMessage | None:
        if previous_id is None:
            return None
        previous = await self._owned(caller, previous_id, param="previous_response_id")
        if MessageState(previous.state) != MessageState.complete:
            raise InvalidRequest(
                "previous_response_not_completed",
                f"the response {previous_id!r} is {previous.state}: only a completed response can be continued",
                param="previous_response_id",
            )
        return previous

    @staticmethod
    def _stage_in_chat(
        session: AsyncSession,
        message: DbMessage,
        items: list[InputItem],
        previous: DbMessage | None,
        previous_chat: DbChat | None,
    ) -> None:
        """The input's user and assistant messages, then the response, as turns of a chat: the previous
        response's chat after it, or a new one."""
        chat = previous_chat
        if chat is None:
            first_user = next((i.text for i in items if isinstance(i, MessageItem) and i.role == "user"), "")
            chat = DbChat(user_id=message.user_id, title=title_from_prompt(first_user or "API response"))
        # System turns and tool calls have no place in a chat; the request keeps them.
        turns = [
            (item.role == "user", item.text)
            for item in items
            if isinstance(item, MessageItem) and item.role in ("user", "assistant")
        ]
        answer_in_chat(session, chat, message, turns, previous.id if previous is not None else None)
        chat.modified_at = message.created_at
        session.add(chat)

    # ------------------------------------------------------------ reading, cancelling, deleting
    async def _owned(self, caller: Caller, response: str, *, param: str | None = None) -> DbMessage:
        """The caller's stored response ``response`` (NotFound for any other id: no one learns whether
        another user's response exists)."""
        message_id = message_id_of(response)
        message = await self._lifecycle.get(message_id) if message_id is not None else None
        if message is None or message.kind != RESPONSE_KIND or message.user_id != caller.user.id:
            raise NotFound("response_not_found", f"no response with id {response[:80]!r}", param=param)
        return message

    async def get(self, caller: Caller, response: str) -> tuple[DbMessage, StoredRequest]:
        message = await self._owned(caller, response)
        return message, self.stored_request(message)

    @staticmethod
    def stored_request(message: DbMessage) -> StoredRequest:
        payload = read_request(message.request_payload, what=f"response {message.id}")
        return StoredRequest.model_validate((payload.response if payload else None) or {})

    @staticmethod
    def event_sequence(message: DbMessage, stored: StoredRequest) -> ResponseEventSequence:
        """The numbered events of the response's stream, the same for every reader."""
        start = to_message_read(message)
        model = message.model_config_name or ""

        def snapshot(
            status: ResponseStatus, output: list[dict[str, Any]], final: MessageRead | None
        ) -> dict[str, Any]:
            return response_object(final or start, model, stored, status=status, output=output)

        return ResponseEventSequence(message.id, snapshot, background=stored.background)

    @staticmethod
    def object_of(message: DbMessage, stored: StoredRequest) -> dict[str, Any]:
        return response_object(to_message_read(message), message.model_config_name or "", stored)

    async def cancel(self, caller: Caller, response: str) -> dict[str, Any]:
        """Cancel a background response that is queued or in progress (a finished one is returned as it
        is); wait a moment for its worker to stop."""
        message, stored = await self.get(caller, response)
        if not stored.background:
            raise InvalidRequest(
                "not_background", "only responses created with background: true can be cancelled"
            )
        if not MessageState(message.state).is_terminal:
            await self._lifecycle.request_cancel(message)
            deadline = asyncio.get_running_loop().time() + _CANCEL_WAIT_SECONDS
            while asyncio.get_running_loop().time() < deadline:
                current = await self._lifecycle.get(message.id)
                if current is None:
                    break
                message = current
                if MessageState(current.state).is_terminal:
                    break
                await asyncio.sleep(0.1)
        return self.object_of(message, stored)

    async def delete(self, caller: Caller, response: str) -> None:
        """Erase the response (stopping it first): its text, request and result; its token counts stay
        for usage. Later responses that continued from it keep their own copy of the conversation."""
        message = await self._owned(caller, response)
        if not MessageState(message.state).is_terminal:
            await self._lifecycle.request_cancel(message)
        async with self._sessions() as session:
            await session.exec(
                update(DbMessage)
                .where(DbMessage.id == message.id, DbMessage.kind == RESPONSE_KIND)
                .values(
                    kind=DELETED_KIND,
                    content=null(),
                    request_payload=null(),
                    result_payload=null(),
                    system_prompt=null(),
                )
            )
            await session.commit()

    async def input_items(self, caller: Caller, response: str) -> list[dict[str, Any]]:
        """The input items of the response, in the order given."""
        _, stored = await self.get(caller, response)
        return stored.input_items
