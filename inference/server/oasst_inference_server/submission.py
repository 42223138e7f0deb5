"""Submitting a generation, for every API: admission, the pending message and its ticket, the queue.

The chat routes (an assistant message) and the OpenAI-compatible API (a completion, an embedding) start
work the same way, through one :class:`SubmissionService` built at startup:

1. admission: what the model's workers can honour (``admission.capabilities``), the user's rate and
   concurrency (``admission.rate_limit``), the chat's size and the model's queue (``admission.limits``),
   and that its work fits one worker frame (``admission.frame_size``: nothing is stored that no frame
   can carry);
2. the pending message is inserted with its fair-queue ticket (``dispatch.fair_share``) and committed;
3. it is queued (``MessageLifecycle.enqueue``). A failure to queue is logged, not raised: the message is
   safely pending in the database, and the recovery loop queues it.

May import admission, chats, streams, dispatch, auth, db, broker, metrics, settings, errors; not api or
openai_api.
"""

from __future__ import annotations

from loguru import logger
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.admission.capabilities import check_capabilities
from oasst_inference_server.admission.frame_size import check_frame_size
from oasst_inference_server.admission.limits import (
    check_chat_capacity,
    check_chat_room,
    check_message_length,
    check_queue_capacity,
)
from oasst_inference_server.admission.output_schemas import check_output_schemas
from oasst_inference_server.admission.rate_limit import check_generation_limits
from oasst_inference_server.admission.request_bounds import check_system_prompt
from oasst_inference_server.chats.chat_store import (
    ChatSize,
    get_own_chat,
    get_parent_message,
    stage_prompter_message,
)
from oasst_inference_server.db.models import DbChat, DbMessage, DbUser, new_id, utcnow
from oasst_inference_server.dispatch import fair_share
from oasst_inference_server.dispatch.handoff import Handoff
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.dispatch.worker_registry import LiveModel, WorkerRegistry
from oasst_inference_server.domain_errors import InvalidRequest, InvalidValue, ServiceUnavailable
from oasst_inference_server.settings import Settings
from oasst_shared.schemas import (
    CreateAssistantMessageRequest,
    CreateTurnRequest,
    MessageState,
    Role,
    SchedulingRequest,
)


class SubmissionService:
    def __init__(
        self,
        settings: Settings,
        lifecycle: MessageLifecycle,
        registry: WorkerRegistry,
        handoff: Handoff | None = None,
    ) -> None:
        self._settings = settings
        self._lifecycle = lifecycle
        self._registry = registry
        self._handoff = handoff

    async def admit(
        self,
        session: AsyncSession,
        user_id: str,
        model_name: str,
        *,
        chat_id: str | None = None,
        chat_size: ChatSize | None = None,
    ) -> ChatSize | None:
        """May the user start a generation now (``RateLimited``), has the chat room for one more message
        (``Conflict``), has the model's queue room (``ServiceUnavailable``)? Counted in the database
        (the chat's ``chat_size`` only if the caller does not know it). Returns the chat's size, which
        the new message's ticket needs (None without a chat)."""
        await check_generation_limits(session, self._settings, user_id)
        size = chat_size
        if size is not None:
            check_chat_room(self._settings, size)
        elif chat_id is not None:
            size = await check_chat_capacity(session, self._settings, chat_id)
        await check_queue_capacity(session, self._settings, model_name)
        return size

    async def submit(
        self,
        session: AsyncSession,
        message: DbMessage,
        user: DbUser,
        requested: SchedulingRequest,
        *,
        chat: DbChat | None = None,
        chat_size: ChatSize | None = None,
        parent: DbMessage | None = None,
        max_input_tokens: int | None = None,
    ) -> DbMessage:
        """Commit ``message`` as pending with its fair-queue ticket (and whatever else ``session`` holds;
        ``chat``, if given, gets it as its newest message), then queue it; or, when nothing waits in the
        model's queue and a worker of this process is idle, hand it to that worker before the commit
        (:mod:`.dispatch.handoff`). ``chat_size``: the chat's, if :meth:`admit` counted it (the ticket
        and the frame's bound then need no query). ``parent``: the message it answers, if the caller
        holds it (a hand-over of a new chat's first answer then reads no conversation).
        ``max_input_tokens``: the model's input budget, to which the conversation sent is cut.

        ``TooLarge`` (nothing stored) if the message's work frame would be over the frame limit."""
        known = (parent,) if parent is not None else ()
        await check_frame_size(
            session, message, max_input_tokens=max_input_tokens, chat_size=chat_size, known=known
        )
        ticket = await fair_share.new_ticket(
            session,
            self._settings,
            message,
            requested,
            user=user,
            chat_characters=chat_size.characters if chat_size is not None else None,
        )
        message.scheduling = ticket.model_dump(mode="json")
        session.add(message)
        if chat is not None:
            chat.modified_at = message.enqueued_at or utcnow()
            chat.active_thread_tail_message_id = message.id
            session.add(chat)
        handed = await self._handoff.try_hand_over(session, message, ticket, known) if self._handoff else None
        if handed is not None:
            try:
                await session.commit()
            except BaseException:
                await handed.committed(False)
                raise
            await handed.committed(True)
            logger.info("message {} ({}) handed to a worker for user {}", message.id, message.kind, user.id)
            return message
        await session.commit()
        try:
            await self._lifecycle.enqueue(message)
        except Exception as exc:
            # The message is safely pending in the database; the recovery loop queues it.
            logger.opt(exception=exc).error("could not queue message {}", message.id)
        logger.info(
            "message {} ({}, {}) queued for user {}",
            message.id,
            message.kind,
            message.model_config_name,
            user.id,
        )
        return message

    async def answer_in_chat(
        self,
        session: AsyncSession,
        user: DbUser,
        chat_id: str,
        request: CreateAssistantMessageRequest,
        requested: SchedulingRequest,
    ) -> DbMessage:
        """Queue the assistant's answer to a prompter message of the user's chat."""
        chat = await get_own_chat(session, user, chat_id)
        parent = await get_parent_message(session, chat, request.parent_id)
        if parent.role != Role.prompter:
            raise InvalidRequest("parent_not_prompter", "an assistant message must answer a prompter message")
        return await self._answer(session, user, chat, parent, request, requested)

    async def turn_in_chat(
        self,
        session: AsyncSession,
        user: DbUser,
        chat_id: str,
        request: CreateTurnRequest,
        requested: SchedulingRequest,
        answer_id: str | None = None,
    ) -> tuple[DbMessage, DbMessage]:
        """Add the user's message and queue the answer to it (with the id ``answer_id`` if given), in one
        transaction: both or neither (a refused answer leaves no unanswered prompt behind)."""
        chat = await get_own_chat(session, user, chat_id)
        if not request.content.strip():
            raise InvalidValue("empty_message", "the message is empty")
        check_message_length(self._settings, request.content)
        size = await check_chat_capacity(session, self._settings, chat.id)
        prompt = await stage_prompter_message(session, chat, request.parent_id, request.content, size=size)
        # The chat as the answer finds it: counted above, plus the prompt (no second count).
        with_prompt = ChatSize(size.messages + 1, size.characters + len(request.content))
        try:
            answer = await self._answer(
                session, user, chat, prompt, request, requested, answer_id, chat_size=with_prompt
            )
        except BaseException:
            await session.rollback()
            raise
        return prompt, answer

    async def _answer(
        self,
        session: AsyncSession,
        user: DbUser,
        chat: DbChat,
        parent: DbMessage,
        request: CreateAssistantMessageRequest | CreateTurnRequest,
        requested: SchedulingRequest,
        message_id: str | None = None,
        chat_size: ChatSize | None = None,
    ) -> DbMessage:
        model = await self._chat_model(request.model_config_name)
        await check_output_schemas(request.sampling_parameters, prefix="sampling_parameters.")
        check_capabilities(request.sampling_parameters, model)
        check_system_prompt(self._settings, request.system_prompt)
        size = await self.admit(session, user.id, model.config.name, chat_id=chat.id, chat_size=chat_size)
        message = DbMessage(
            id=message_id or new_id(),
            chat_id=chat.id,
            parent_id=parent.id,
            role=Role.assistant,
            state=MessageState.pending,
            model_config_name=model.config.name,
            sampling_parameters=request.sampling_parameters.model_dump(mode="json"),
            system_prompt=request.system_prompt,
            enqueued_at=utcnow(),
        )
        return await self.submit(
            session,
            message,
            user,
            requested,
            chat=chat,
            chat_size=size,
            parent=parent,
            max_input_tokens=model.config.max_input_length,
        )

    async def _chat_model(self, name: str) -> LiveModel:
        """The live model ``name``: ``InvalidRequest`` if unknown, ``ServiceUnavailable`` if no worker
        serves it now."""
        live = await self._registry.live_models(wanted=name)
        if name in live:
            return live[name]
        available = ", ".join(sorted(live)) or "none"
        if name in self._registry.known_model_names(live):
            raise ServiceUnavailable(
                "no_worker", f"no worker serves model {name!r} right now; available: {available}"
            )
        raise InvalidRequest("unknown_model", f"unknown model {name!r}; available models: {available}")
