"""Serving the OpenAI-compatible API on the shared queue: one message per request.

Each request becomes a :class:`DbMessage` (``kind`` "completion" or "embedding", with the caller's
``user_id`` and ``api_key_id``) on the same queue, workers, limits and accounting as chat answers. The
route then follows the message's events with the reader the chat SSE endpoint uses and translates them
into OpenAI's shapes (:mod:`oasst_inference_server.openai_api.openai_streams`).

A request whose client goes away (a closed stream, a dropped connection) cancels its message, so the
worker stops generating; the token counts the worker reports for the cancelled message are its usage.

What is kept of a request (``store_api_conversations``):

* off (the default): once answered, the message keeps its token counts, model, state and timestamps;
  its prompt, answer and vectors are erased (``_scrub``). Requests abandoned mid-way are erased when
  their worker reports back, and a sweep on every later request of the user catches any left behind
  (e.g. by a replica that stopped);
* on: a chat completion or completion is stored as a chat of the user (the prompt turns, then the
  answer), listed with their other chats and continuable there; embedding inputs are kept, vectors not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import aclosing
from typing import Any, NamedTuple

import anyio
from loguru import logger
from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.broker import Broker
from oasst_inference_server.chats.chat_store import title_from_prompt
from oasst_inference_server.db.models import DbChat, DbMessage, DbUser, MessageKind, utcnow
from oasst_inference_server.db.payloads import RequestPayload, read_embeddings
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.domain_errors import (
    ContentRefused,
    GenerationFailed,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
)
from oasst_inference_server.events import plain_token_text
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.openai_api.api_scrub import ApiScrub
from oasst_inference_server.routing.router import Route
from oasst_inference_server.scheduling.worker_registry import LiveModel, WorkerRegistry
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.event_reader import read_message_events
from oasst_inference_server.streams.fanout import StreamFanout
from oasst_inference_server.streams.message_reads import MessageReads
from oasst_inference_server.streams.reader_slots import resumed_readers
from oasst_inference_server.submission import SubmissionService
from oasst_shared.logprobs import TokenLogprob
from oasst_shared.model_configs import ModelKind
from oasst_shared.protocol import ChatTurn
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import (
    ErrorEvent,
    MessageEvent,
    MessageRead,
    MessageState,
    RetryEvent,
    Role,
    SchedulingRequest,
    StreamEvent,
    TokenEvent,
)
from oasst_shared.tool_calls import ToolChoice, ToolDefinition

IsDisconnected = Callable[[], Awaitable[bool]]
# Adds what places a new message (its chat, its turns) to the session, before admission writes.
StageMessage = Callable[[AsyncSession, DbMessage], None]
_STREAM_EVENT: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)


class TokenText(NamedTuple):
    """A token event with nothing but its text, the text kept as the JSON string stored: the stream's
    hot path puts it into each chunk as it is, without a model or a decode per token."""

    json: str


def _decoded(data: str) -> StreamEvent | TokenText:
    text = plain_token_text(data)
    return TokenText(text) if text is not None else _STREAM_EVENT.validate_json(data)


_ABANDONED_WAIT_SECONDS = 600.0
_background: set[asyncio.Task[None]] = set()


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


def generation_failure(event: ErrorEvent) -> GenerationFailed | InvalidRequest:
    """The error to report for a terminal ``error`` event: a request the model's backend refused as
    invalid is the caller's fault (``InvalidRequest``: a 400), any other failure the server's."""
    state = event.message.state if event.message is not None else MessageState.failed
    if state == MessageState.refused:
        return InvalidRequest("request_refused_by_model", event.error or "the model refused this request")
    return GenerationFailed(f"generation_{state.value}", f"the generation failed: {event.error or state}")


def answer_in_chat(
    session: AsyncSession,
    chat: DbChat,
    message: DbMessage,
    turns: Iterable[tuple[bool, str]],
    parent_id: str | None,
) -> None:
    """Write ``turns`` ((is the user's, text), in order) into ``chat`` below ``parent_id``, then ``message``
    as the answer to the last of them: the chat's thread now ends with it."""
    for prompter, content in turns:
        stored = DbMessage(
            chat_id=chat.id,
            parent_id=parent_id,
            role=Role.prompter if prompter else Role.assistant,
            content=content,
            state=MessageState.manual if prompter else MessageState.complete,
        )
        session.add(stored)
        parent_id = stored.id
    message.chat_id = chat.id
    message.parent_id = parent_id
    message.created_at = message.enqueued_at = utcnow()  # after its turns, in the chat's order
    chat.active_thread_tail_message_id = message.id


class OpenAIService:
    def __init__(
        self,
        settings: Settings,
        session_factory: async_sessionmaker[AsyncSession],
        fanout: StreamFanout,
        reads: MessageReads,
        lifecycle: MessageLifecycle,
        registry: WorkerRegistry,
        submission: SubmissionService,
    ):
        self.settings = settings
        self._sessions = session_factory
        self._fanout = fanout
        self._reads = reads
        self._lifecycle = lifecycle
        self._registry = registry
        self._submission = submission
        self._scrub = ApiScrub(session_factory, keep_text=settings.store_api_conversations)

    @property
    def moderation(self) -> Moderation | None:
        """The moderation hook (None: not built, as in some tests)."""
        return self._submission.moderation

    async def refuse_moderated(self, answers: Sequence[MessageRead]) -> None:
        """``ContentRefused`` if the moderation hook refused one of these finished answers (an unstreamed
        answer is refused as its prompt would be; a streamed one ends with ``content_filter``)."""
        moderation = self.moderation
        for answer in answers:
            if moderation is None or answer.finish_reason != "content_filter":
                continue
            flag = await moderation.flags.answer_flag(answer.id)
            if flag is not None and flag.action == "refuse":
                raise ContentRefused(
                    "content_policy_violation",
                    f"the answer was refused by moderation ({flag.check}: {', '.join(flag.categories)})",
                    categories=list(flag.categories),
                )

    @property
    def broker(self) -> Broker:
        return self._fanout.broker

    async def own_request(self, caller: Caller, message_id: str) -> DbMessage | None:
        """The caller's API request ``message_id`` (a completion), or None: another user's is none."""
        message = await self._lifecycle.get(message_id)
        if message is None or message.user_id != caller.user.id or message.kind != MessageKind.completion:
            return None
        return message

    # ------------------------------------------------------------ models
    async def live_models(self, wanted: str | None = None) -> dict[str, LiveModel]:
        return await self._registry.live_models(wanted)

    async def fleet_models(self, wanted: str | None = None) -> dict[str, LiveModel]:
        """The models workers have loaded and, with on-demand loading, those a worker can load."""
        return await self._registry.fleet_models(wanted)

    async def alias_routes(self) -> list[Route]:
        """Every alias, routed (its config, then its fallbacks), by name."""
        return await self._submission.router.alias_routes()

    async def resolve_model(self, name: str, kind: ModelKind, *, load: bool = True) -> LiveModel:
        """The model that serves ``name`` (an alias's config or the name's, else a fallback of it that can
        serve: ``routing.router``) of ``kind``, loaded by a worker or loadable by one (the request, once
        queued, has a worker load it: ``fleet.on_demand``): NotFound if unknown, ServiceUnavailable if no
        worker serves it or can load it now, InvalidRequest if it is of another kind. ``load`` false: a
        model nobody has loaded is ServiceUnavailable (a question only a loaded model can answer, such as
        a tokenization)."""
        picked = await self._submission.router.pick(name, loaded_only=not load)
        model, route = picked.model, picked.route
        live = await self._registry.fleet_models()
        available = ", ".join(sorted(n for n, m in live.items() if m.config.kind == kind)) or "none"
        if model is None:
            if route.target in self._registry.known_model_names(live):
                raise ServiceUnavailable(
                    "model_unavailable",
                    f"no worker serves the model {route.named(route.target)} right now; available: {available}",
                    param="model",
                )
            raise NotFound(
                "model_not_found",
                f"the model {route.named(route.target)} does not exist; available models: {available}",
                param="model",
            )
        if model.config.kind != kind:
            use = "/v1/embeddings" if model.config.kind == "embedding" else "/v1/chat/completions"
            raise InvalidRequest(
                "wrong_model_kind",
                f"{name!r} is a {model.config.kind} model: use {use} (available here: {available})",
                param="model",
            )
        if not model.loaded:
            if not load:
                raise ServiceUnavailable(
                    "model_not_loaded",
                    f"no worker has the model {name!r} loaded right now (a request that generates loads it)",
                    param="model",
                )
        return model

    # ------------------------------------------------------------ submitting requests
    async def submit_chat(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        choices: Sequence[SamplingParameters],
        system_prompt: str | None,
        thread: list[ChatTurn],
        tools: list[ToolDefinition] | None = None,
        tool_choice: ToolChoice | None = None,
        *,
        kind: MessageKind = MessageKind.completion,
        stage: StageMessage | None = None,
    ) -> list[DbMessage]:
        """One message per choice (each with its sampling), admitted together: the caller's limits, as
        on the chat API, count every one. First the prompt must fit the model (``InvalidRequest``
        ``context_length_exceeded`` if the system prompt and the last message alone do not).

        ``kind``: the messages' kind (the Responses API's stored responses have their own); ``stage``,
        if given, places each message (e.g. in a chat, with what else its request keeps) instead of
        ``store_api_conversations``."""
        if self._submission.moderation_classifies:
            await self._precheck(caller, model, len(choices))
        system_prompt, thread = await self._moderate_chat(caller, system_prompt, thread)
        if self._submission.prompt_fit is not None:
            offered = tools if tool_choice != "none" else None
            await self._submission.prompt_fit.check_chat_completion(
                model, system_prompt, thread, offered, tool_choice if offered else None
            )
        if tools:
            payload = RequestPayload(thread=thread, tools=tools, tool_choice=tool_choice)
        else:
            payload = RequestPayload(thread=thread)
        messages = [
            self._new_message(caller, kind, model, sampling, payload, system_prompt=system_prompt)
            for sampling in choices
        ]
        return await self._submit(session, caller, model, messages, thread, stage)

    async def admit_question(self, caller: Caller, model: LiveModel) -> None:
        """A question to a model's worker that starts no generation (a tokenization): the caller's key
        and user limits take it as a request (403 for a model they may not use; it counts against
        requests per minute; a spent budget refuses it)."""
        quotas = self._submission.quotas
        if quotas is None:
            return
        async with self._sessions() as session:
            await quotas.admit(session, caller.user.id, caller.api_key_id, model.config.name)

    async def _precheck(self, caller: Caller, model: LiveModel, count: int) -> None:
        """The caller's limits, before the classifier's embedding job (its own short session: the
        request's may hold what it staged)."""
        async with self._sessions() as session:
            await self._submission.precheck(
                session, caller.user.id, model.config.name, count=count, api_key_id=caller.api_key_id
            )

    async def _moderate_chat(
        self, caller: Caller, system_prompt: str | None, thread: list[ChatTurn]
    ) -> tuple[str | None, list[ChatTurn]]:
        """The moderation hook on what the caller wrote: the system prompt and every turn (refused:
        ``ContentRefused``; replaced: returned with the replacement). Every turn: an API caller writes
        the tool results and the assistant turns it sends as much as its own (a listed word in a tool
        turn would otherwise reach the model unchecked)."""
        moderation = self._submission.moderation
        if moderation is None or not moderation.on_requests:
            return system_prompt, thread
        places = [i for i, turn in enumerate(thread) if turn.content]
        texts = [thread[i].content for i in places]
        if system_prompt:
            texts.append(system_prompt)
        checked = await moderation.moderate_request(caller.user.id, texts)
        if system_prompt:
            system_prompt = checked.pop()
        thread = list(thread)
        for index, text in zip(places, checked, strict=True):
            if text != thread[index].content:
                thread[index] = thread[index].model_copy(update={"content": text})
        return system_prompt, thread

    async def submit_completion(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        choices: Sequence[SamplingParameters],
        prompt: str,
    ) -> list[DbMessage]:
        """As :meth:`submit_chat`, for a raw prompt, which must fit the model whole."""
        moderation = self._submission.moderation
        if self._submission.moderation_classifies:
            await self._precheck(caller, model, len(choices))
        if moderation is not None and moderation.on_requests:
            (prompt,) = await moderation.moderate_request(caller.user.id, [prompt])
        if self._submission.prompt_fit is not None:
            await self._submission.prompt_fit.check_completion(model, prompt)
        messages = [
            self._new_message(
                caller, MessageKind.completion, model, sampling, RequestPayload(raw_prompt=prompt)
            )
            for sampling in choices
        ]
        return await self._submit(session, caller, model, messages, [ChatTurn(role="user", content=prompt)])

    async def submit_embedding(
        self, session: AsyncSession, caller: Caller, model: LiveModel, inputs: list[str]
    ) -> DbMessage:
        message = self._new_message(caller, MessageKind.embedding, model, None, RequestPayload(inputs=inputs))
        (submitted,) = await self._submit(session, caller, model, [message])
        return submitted

    def _new_message(
        self,
        caller: Caller,
        kind: MessageKind,
        model: LiveModel,
        sampling: SamplingParameters | None,
        payload: RequestPayload,
        *,
        system_prompt: str | None = None,
    ) -> DbMessage:
        return DbMessage(
            kind=kind,
            user_id=caller.user.id,
            api_key_id=caller.api_key_id,
            role=Role.assistant,
            state=MessageState.pending,
            model_config_name=model.config.name,
            sampling_parameters=sampling.model_dump(mode="json") if sampling else None,
            system_prompt=system_prompt,
            request_payload=payload.stored(),
            enqueued_at=utcnow(),
        )

    @staticmethod
    def _store_as_chat(session: AsyncSession, message: DbMessage, thread: list[ChatTurn]) -> None:
        """Keep the conversation as a chat: its turns (user -> prompter), then the pending answer."""
        first_user = next((t.content for t in thread if t.role == "user"), "") or "API request"
        chat = DbChat(user_id=message.user_id, title=title_from_prompt(first_user))
        session.add(chat)
        # No place in a chat for system and tool turns; the request keeps them.
        turns = [(t.role == "user", t.content) for t in thread if t.role in ("user", "assistant")]
        answer_in_chat(session, chat, message, turns, None)

    async def _submit(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        messages: list[DbMessage],
        thread: list[ChatTurn] | None = None,
        stage: StageMessage | None = None,
    ) -> list[DbMessage]:
        """Admit, commit and queue the messages together; with ``store_api_conversations``, ``thread``
        as the chat of each (only added to the session here: its first write is admission's, which
        holds the user's turn). ``stage`` instead places each message itself (added, not written)."""
        if stage is not None:
            for message in messages:
                stage(session, message)
        elif thread is not None and self.settings.store_api_conversations:
            for message in messages:
                self._store_as_chat(session, message, thread)
        return await self._submission.submit_requests(
            session, messages, caller.user, caller.scheduling, max_input_tokens=model.config.max_input_length
        )

    # ------------------------------------------------------------ following a request
    async def events(
        self, message: DbMessage, is_disconnected: IsDisconnected
    ) -> AsyncGenerator[list[StreamEvent | TokenText], None]:
        """The message's events, decoded, in batches (one per broker read); ends after the terminal
        one, or early if the client left. A token with nothing but its text comes as :class:`TokenText`."""
        reader = read_message_events(self._reads, self._fanout, self.settings, message, None, is_disconnected)
        async with aclosing(reader) as batches:
            async for batch in batches:
                yield [_decoded(entry["data"]) for entry in batch]

    async def positioned_events(
        self, message: DbMessage, is_disconnected: IsDisconnected
    ) -> AsyncGenerator[list[tuple[str | None, StreamEvent | TokenText]], None]:
        """As :meth:`events`, each event with its broker entry id (None for one that was not stored: a
        queue position, a final answer rebuilt from the database), from the first event on."""
        reader = read_message_events(self._reads, self._fanout, self.settings, message, None, is_disconnected)
        async with aclosing(reader) as batches:
            async for batch in batches:
                yield [(entry.get("id"), _decoded(entry["data"])) for entry in batch]

    async def wait(
        self,
        message: DbMessage,
        is_disconnected: IsDisconnected,
        logprobs: list[TokenLogprob] | None = None,
    ) -> MessageRead:
        """Wait for the finished message; raise its failure (``GenerationFailed``), or ``ClientGone``.

        ``logprobs``, if given, receives the token logprobs of the answer's token events.
        """
        finished = False
        try:
            async with aclosing(self.events(message, is_disconnected)) as batches:
                async for batch in batches:
                    for event in batch:
                        if logprobs is not None:
                            if isinstance(event, TokenEvent):
                                logprobs.extend(event.logprobs or [])
                            elif isinstance(event, RetryEvent):
                                logprobs.clear()  # the tokens before a retry are discarded
                        if isinstance(event, MessageEvent):
                            finished = True
                            return event.message
                        if isinstance(event, ErrorEvent):
                            finished = True
                            raise generation_failure(event)
                    if await is_disconnected():
                        break  # nobody waits for the rest: stop the worker now
            raise ClientGone()
        finally:
            await self.settle(message, finished, scrub=message.kind != MessageKind.embedding)

    async def settle(
        self, message: DbMessage, finished: bool, *, scrub: bool = True, resumable: bool = False
    ) -> None:
        """After a request: cancel it if its client left before the end; erase what is not kept.

        ``resumable`` (a stream with ids): the cancel waits ``openai_stream_resume_grace_seconds``
        and does not happen if a client resumed the stream meanwhile (:mod:`.stream_resume`).
        Shielded, so it completes even while the request's task is being cancelled (a disconnect).
        """
        with anyio.CancelScope(shield=True):
            try:
                if not finished and resumable and self.settings.openai_stream_resume_grace_seconds > 0:
                    _spawn(self._abandon_after_grace(message), name=f"grace-{message.id}")
                elif not finished:
                    await self._abandon(message)
                elif scrub:
                    await self.scrub(message)
            except Exception as exc:
                logger.opt(exception=exc).error("could not settle API request {}", message.id)

    async def _abandon(self, message: DbMessage) -> None:
        current = await self._lifecycle.get(message.id)
        if current is not None and not MessageState(current.state).is_terminal:
            await self._lifecycle.request_cancel(current)
            logger.info("API request {}: the client left, generation cancelled", message.id)
        _spawn(self._scrub_when_finished(message), name=f"scrub-{message.id}")

    async def _abandon_after_grace(self, message: DbMessage) -> None:
        """Cancel an abandoned stream's message once the grace has passed, unless a resumed reader of
        it is reading (it holds a reader slot of the message, on any replica)."""
        await asyncio.sleep(self.settings.openai_stream_resume_grace_seconds)
        try:
            if await resumed_readers(self._fanout.broker, message.id):
                logger.info("API request {}: resumed within the grace, not cancelled", message.id)
                return
            await self._abandon(message)
        except Exception as exc:
            logger.opt(exception=exc).error("could not settle API request {} after its grace", message.id)

    async def _scrub_when_finished(self, message: DbMessage) -> None:
        deadline = asyncio.get_running_loop().time() + _ABANDONED_WAIT_SECONDS
        while asyncio.get_running_loop().time() < deadline:
            current = await self._lifecycle.get(message.id)
            if current is None:
                return
            if MessageState(current.state).is_terminal:
                await self.scrub(current)
                return
            await asyncio.sleep(1.0)

    # ------------------------------------------------------------ what is kept
    async def scrub(self, message: DbMessage) -> None:
        """Erase the content of one answered request (and of the user's older ones left behind), in one
        statement (:mod:`.api_scrub`)."""
        await self._scrub.scrub(message)

    async def embed(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        inputs: list[str],
        is_disconnected: IsDisconnected,
    ) -> tuple[list[list[float]], int, str]:
        """Embed ``inputs`` as ``/v1/embeddings`` does: their vectors (in order), the prompt tokens and the
        request's id; ``GenerationFailed`` if the worker's answer does not have one vector per input."""
        message = await self.submit_embedding(session, caller, model, inputs)
        await session.close()
        try:
            await self.wait(message, is_disconnected)
            vectors, prompt_tokens = await self.embeddings_of(message)
        finally:
            await self.settle(message, finished=True)  # the vectors are read: erase them
        if len(vectors) != len(inputs):
            raise GenerationFailed(
                "embeddings_mismatch", f"the worker returned {len(vectors)} vectors for {len(inputs)} inputs"
            )
        return vectors, prompt_tokens, message.id

    async def embed_unmetered(self, user: DbUser, model: LiveModel, inputs: list[str]) -> list[list[float]]:
        """Embed ``inputs`` for the server's own use on behalf of ``user`` (the moderation classifier): no
        rate limit or queue bound is applied (the user's request that needs it was admitted already)."""
        message = self._new_message(
            Caller(user), MessageKind.embedding, model, None, RequestPayload(inputs=inputs)
        )
        async with self._sessions() as session:
            await self._submission.submit(session, [message], user, SchedulingRequest())
        try:
            await self.wait(message, _never_disconnected)
            vectors, _ = await self.embeddings_of(message)
        finally:
            await self.settle(message, finished=True)
        return vectors

    async def embeddings_of(self, message: DbMessage) -> tuple[list[list[float]], int]:
        """The vectors and prompt tokens of a finished embedding request (read before the scrub)."""
        current = await self._lifecycle.get(message.id)
        vectors = read_embeddings(current.result_payload) if current else None
        if current is None or vectors is None:
            raise GenerationFailed("embeddings_missing", "the worker returned no embeddings")
        return vectors, current.prompt_tokens or 0


async def _never_disconnected() -> bool:
    return False


def _spawn(coroutine: Coroutine[Any, Any, None], name: str) -> None:
    """Run a follow-up that outlives its request (kept referenced until done)."""
    task = asyncio.create_task(coroutine, name=name)
    _background.add(task)
    task.add_done_callback(_background.discard)
