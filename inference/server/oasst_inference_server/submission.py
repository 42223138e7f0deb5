"""Submitting a generation, for every API: admission, the pending message and its ticket, the queue.

The chat routes (an assistant message) and the OpenAI-compatible API (a completion, an embedding) start
work the same way, through one :class:`SubmissionService` built at startup:

1. admission: what the model's workers can honour (``admission.capabilities``), the user's rate and
   concurrency (``admission.rate_limit``, counting every generation the request starts: a ``/v1``
   request with ``n`` choices is ``n``), the chat's size and the model's queue (``admission.limits``),
   and that its work fits one worker frame (``admission.frame_size``: nothing is stored that no frame
   can carry);
2. the pending messages are inserted with their fair-queue tickets (``scheduling.fair_share``) and
   committed, in the transaction that checked the limits, with the user's turn held
   (``admission.user_turns``: one submission of a user at a time, on SQLite too);
3. they are queued (``MessageLifecycle.enqueue``). A failure to queue is logged, not raised: the message
   is safely pending in the database, and the recovery loop queues it. A queued message of a model that
   no worker serves has a worker told to load it (``fleet.on_demand``).

The model a request names is routed first (``routing``: an alias's config, or a fallback when the model
has no worker or a full queue); the message carries the config that serves it.

May import admission, routing, chats, streams, dispatch, auth, moderation, fleet, quotas, db, broker,
metrics, settings, errors; not api or openai_api.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from oasst_inference_server.admission.prompt_fit import PromptFit
from oasst_inference_server.admission.rate_limit import check_generation_limits
from oasst_inference_server.admission.request_bounds import check_system_prompt
from oasst_inference_server.admission.user_turns import UserTurns
from oasst_inference_server.chats.chat_store import (
    ChatSize,
    get_own_chat,
    get_parent_message,
    stage_prompter_message,
)
from oasst_inference_server.db.models import DbChat, DbMessage, DbUser, new_id, utcnow
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.domain_errors import InvalidRequest, InvalidValue, ServiceUnavailable
from oasst_inference_server.fleet.on_demand import OnDemandLoads
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.quotas.gate import QuotaGate
from oasst_inference_server.routing.router import ModelRouter
from oasst_inference_server.scheduling import fair_share
from oasst_inference_server.scheduling.handoff import HandedOver, Handoff
from oasst_inference_server.scheduling.worker_registry import LiveModel, WorkerRegistry
from oasst_inference_server.settings import Settings
from oasst_shared.model_registry import builtin_registry
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
        prompt_fit: PromptFit | None = None,
        loads: OnDemandLoads | None = None,
        quotas: QuotaGate | None = None,
        router: ModelRouter | None = None,
        moderation: Moderation | None = None,
    ) -> None:
        self._settings = settings
        # The limits of API keys and users an admin set (requests, tokens, budgets, allowed models).
        self.quotas = quotas
        # Which config serves a name (aliases, fallbacks); without one, every name is a config's.
        self.router = router or ModelRouter(
            registry, None, registry.broker, builtin_registry(), settings.max_queue_size
        )
        self._loads = loads  # a request for a model nobody has loaded has a worker load it
        self._lifecycle = lifecycle
        self._registry = registry
        self._handoff = handoff
        # Without it (tests of other parts), prompts are not sized at submission.
        self.prompt_fit = prompt_fit
        # The moderation hook on prompts (None or off: not checked).
        self.moderation = moderation
        # SQLite cannot lock the user's row: admission takes turns per user in this one process.
        self.turns = UserTurns(enabled=settings.is_sqlite)

    async def admit(
        self,
        session: AsyncSession,
        user_id: str,
        model_name: str,
        *,
        count: int = 1,
        chat_id: str | None = None,
        chat_size: ChatSize | None = None,
        api_key_id: str | None = None,
    ) -> ChatSize | None:
        """May the user start ``count`` generations now (``RateLimited``; ``InvalidRequest`` if ``count``
        alone is over a limit), has the chat room for one more message (``Conflict``), has the model's
        queue room (``ServiceUnavailable``), do the key's and the user's usage limits let it in
        (``NotPermitted`` for a model they may not use, ``RateLimited``; counted in the broker, last)?
        Counted in the database (the chat's ``chat_size`` only if the caller does not know it). Returns the chat's size, which the new message's ticket needs
        (None without a chat). Call it holding the user's turn (:meth:`submit_requests` and the chat
        methods do), in the transaction that inserts the generations."""
        await check_generation_limits(session, self._settings, user_id, count)
        size = chat_size
        if size is not None:
            check_chat_room(self._settings, size)
        elif chat_id is not None:
            size = await check_chat_capacity(session, self._settings, chat_id)
        await check_queue_capacity(session, self._settings, model_name)
        if self.quotas is not None:
            await self.quotas.admit(session, user_id, api_key_id, model_name, count)
        return size

    async def precheck(
        self,
        session: AsyncSession,
        user_id: str,
        model_name: str,
        *,
        count: int = 1,
        api_key_id: str | None = None,
    ) -> None:
        """What :meth:`admit` would refuse of the user's and key's limits now, counting nothing and
        locking nothing: called before work a request costs ahead of its admission (the moderation
        classifier's embeddings), so a request admission refuses costs the fleet nothing."""
        await check_generation_limits(session, self._settings, user_id, count, lock=False)
        if self.quotas is not None:
            await self.quotas.admit(session, user_id, api_key_id, model_name, count, counted=False)

    @property
    def moderation_classifies(self) -> bool:
        """The moderation hook checks prompts with its classifier (an embedding job per request)."""
        return self.moderation is not None and self.moderation.on_requests and self.moderation.classifies

    async def submit_requests(
        self,
        session: AsyncSession,
        messages: Sequence[DbMessage],
        user: DbUser,
        requested: SchedulingRequest,
        max_input_tokens: int | None = None,
    ) -> list[DbMessage]:
        """Admit the API requests' ``messages`` (all of one model, one per choice) as one: the user's
        limits count every one of them, and they are inserted and committed together, so no other
        request of the user is admitted between them. Then queue them (or hand them over)."""
        model_name = messages[0].model_config_name or ""
        async with self.turns.turn(user.id, session):
            await self.admit(
                session, user.id, model_name, count=len(messages), api_key_id=messages[0].api_key_id
            )
            return await self.submit(session, messages, user, requested, max_input_tokens=max_input_tokens)

    async def submit(
        self,
        session: AsyncSession,
        messages: Sequence[DbMessage],
        user: DbUser,
        requested: SchedulingRequest,
        *,
        chat: DbChat | None = None,
        chat_size: ChatSize | None = None,
        parent: DbMessage | None = None,
        max_input_tokens: int | None = None,
    ) -> list[DbMessage]:
        """Commit ``messages`` as pending with their fair-queue tickets (and whatever else ``session``
        holds; ``chat``, if given, gets the last as its newest message), in one transaction, then queue
        them; or, when nothing waits in the model's queue and a worker of this process is idle, hand one
        to that worker before the commit (:mod:`.scheduling.handoff`). ``chat_size``: the chat's, if
        :meth:`admit` counted it (the tickets and the frame's bound then need no query). ``parent``: the
        message they answer, if the caller holds it (a hand-over of a new chat's first answer then reads
        no conversation). ``max_input_tokens``: the model's input budget, to which the conversation sent
        is cut.

        ``TooLarge`` (nothing stored) if a message's work frame would be over the frame limit."""
        known = (parent,) if parent is not None else ()
        chat_characters = chat_size.characters if chat_size is not None else None
        tickets = []
        for message in messages:
            await check_frame_size(
                session, message, max_input_tokens=max_input_tokens, chat_size=chat_size, known=known
            )
            ticket = await fair_share.new_ticket(
                session,
                self._settings,
                message,
                requested,
                user=user,
                chat_characters=chat_characters,
                known=known,
            )
            message.scheduling = ticket.model_dump(mode="json")
            session.add(message)
            tickets.append(ticket)
        if chat is not None:
            chat.modified_at = messages[-1].enqueued_at or utcnow()
            chat.active_thread_tail_message_id = messages[-1].id
            session.add(chat)
        known = (parent,) if parent is not None else ()
        handed: list[HandedOver] = []
        queued: set[str] = set()
        for message, ticket in zip(messages, tickets, strict=True):
            if self._handoff is not None:
                try:
                    handover = await self._handoff.try_hand_over(session, message, ticket, known)
                except BaseException:
                    for earlier in handed:
                        await earlier.committed(False)
                    raise
                if handover is not None:
                    handed.append(handover)
                    continue
            queued.add(message.id)
        try:
            await session.commit()
        except BaseException:
            for handover in handed:
                await handover.committed(False)
            raise
        for handover in handed:
            await handover.committed(True)
        for message in messages:
            if message.id in queued:
                await self._queue(message)
                if self._loads is not None and message.model_config_name:
                    self._loads.wanted(message.model_config_name)  # a model nobody serves: loaded
            logger.info(
                "message {} ({}, {}) {} for user {}",
                message.id,
                message.kind,
                message.model_config_name,
                "queued" if message.id in queued else "handed to a worker",
                user.id,
            )
        return list(messages)

    async def _queue(self, message: DbMessage) -> None:
        try:
            await self._lifecycle.enqueue(message)
        except Exception as exc:
            # The message is safely pending in the database; the recovery loop queues it.
            logger.opt(exception=exc).error("could not queue message {}", message.id)

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
        model = await self._answer_model(request, parent.content or "")
        if self.moderation_classifies:
            await self.precheck(session, user.id, model.config.name)
        if self.moderation is not None and self.moderation.on_requests:
            content, system_prompt = await self._moderate_turn(
                user.id, parent.content or "", request.system_prompt, message_id=parent.id, chat_id=chat.id
            )
            if content != parent.content:
                parent.content = content  # replaced: stored with the answer
                session.add(parent)
            request = request.model_copy(update={"system_prompt": system_prompt})
        async with self.turns.turn(user.id, session):
            return await self._answer(session, user, chat, parent, request, requested, model)

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
        model = await self._answer_model(request, request.content)
        if self.moderation_classifies:
            await self.precheck(session, user.id, model.config.name)
        if self.moderation is not None and self.moderation.on_requests:
            content, system_prompt = await self._moderate_turn(
                user.id, request.content, request.system_prompt, chat_id=chat.id
            )
            request = request.model_copy(update={"content": content, "system_prompt": system_prompt})
        # The turn before the staged prompt's write (see admission.user_turns).
        async with self.turns.turn(user.id, session):
            size = await check_chat_capacity(session, self._settings, chat.id)
            prompt = await stage_prompter_message(
                session, chat, request.parent_id, request.content, size=size
            )
            # The chat as the answer finds it: counted above, plus the prompt (no second count).
            with_prompt = ChatSize(size.messages + 1, size.characters + len(request.content))
            try:
                answer = await self._answer(
                    session, user, chat, prompt, request, requested, model, answer_id, chat_size=with_prompt
                )
            except BaseException:
                await session.rollback()
                raise
        return prompt, answer

    async def _moderate_turn(
        self,
        user_id: str,
        content: str,
        system_prompt: str | None,
        *,
        message_id: str | None = None,
        chat_id: str | None = None,
    ) -> tuple[str, str | None]:
        """The moderation hook on what the user wrote for this answer: the prompt and the system prompt
        the request sends (the model reads both). Returns them, replaced where the hook replaces."""
        assert self.moderation is not None
        texts = [content, system_prompt] if system_prompt else [content]
        checked = await self.moderation.moderate_request(
            user_id, texts, message_id=message_id, chat_id=chat_id
        )
        return checked[0], (checked[1] if system_prompt else system_prompt)

    async def _answer_model(
        self, request: CreateAssistantMessageRequest | CreateTurnRequest, newest: str
    ) -> LiveModel:
        """The model of an answer to ``newest``, once the request is known to be one it can serve: its
        workers' capabilities, the system prompt's length, the prompt's size in the model's tokens."""
        model = await self._chat_model(request.model_config_name)
        await check_output_schemas(request.sampling_parameters, prefix="sampling_parameters.")
        check_capabilities(request.sampling_parameters, model)
        check_system_prompt(self._settings, request.system_prompt)
        if self.prompt_fit is not None:
            await self.prompt_fit.check_chat_answer(model, request.system_prompt, newest)
        return model

    async def _answer(
        self,
        session: AsyncSession,
        user: DbUser,
        chat: DbChat,
        parent: DbMessage,
        request: CreateAssistantMessageRequest | CreateTurnRequest,
        requested: SchedulingRequest,
        model: LiveModel,
        message_id: str | None = None,
        chat_size: ChatSize | None = None,
    ) -> DbMessage:
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
        (submitted,) = await self.submit(
            session,
            [message],
            user,
            requested,
            chat=chat,
            chat_size=size,
            parent=parent,
            max_input_tokens=model.config.max_input_length,
        )
        return submitted

    async def _chat_model(self, name: str) -> LiveModel:
        """The model that serves ``name`` (routed: ``routing.router``), loaded by a worker or loadable by
        one (the answer, once queued, has a worker load it: ``fleet.on_demand``): ``InvalidRequest`` if
        unknown, ``ServiceUnavailable`` if no worker serves it (or a fallback) or can load it now."""
        picked = await self.router.pick(name)
        if picked.model is not None:
            return picked.model
        target = picked.route.target
        live = await self._registry.fleet_models()
        available = ", ".join(sorted(live)) or "none"
        if target in self._registry.known_model_names(live):
            raise ServiceUnavailable(
                "no_worker",
                f"no worker serves model {picked.route.named(target)} right now; available: {available}",
            )
        raise InvalidRequest(
            "unknown_model", f"unknown model {picked.route.named(target)}; available models: {available}"
        )
