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
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from contextlib import aclosing
from datetime import timedelta
from typing import Any, NamedTuple

import anyio
from loguru import logger
from pydantic import TypeAdapter
from sqlalchemy import case, null, or_, update
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.chats.chat_store import title_from_prompt
from oasst_inference_server.db.models import DbChat, DbMessage, utcnow
from oasst_inference_server.dispatch.events import plain_token_text
from oasst_inference_server.dispatch.message_lifecycle import MessageLifecycle
from oasst_inference_server.dispatch.worker_registry import LiveModel, WorkerRegistry
from oasst_inference_server.domain_errors import (
    GenerationFailed,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
)
from oasst_inference_server.settings import Settings
from oasst_inference_server.streams.event_reader import read_message_events
from oasst_inference_server.streams.fanout import StreamFanout
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
    StreamEvent,
    TokenEvent,
)
from oasst_shared.tool_calls import ToolChoice, ToolDefinition

IsDisconnected = Callable[[], Awaitable[bool]]
_STREAM_EVENT: TypeAdapter[StreamEvent] = TypeAdapter(StreamEvent)


class TokenText(NamedTuple):
    """A token event with nothing but its text, the text kept as the JSON string stored: the stream's
    hot path puts it into each chunk as it is, without a model or a decode per token."""

    json: str


def _decoded(data: str) -> StreamEvent | TokenText:
    text = plain_token_text(data)
    return TokenText(text) if text is not None else _STREAM_EVENT.validate_json(data)


API_KINDS = ("completion", "embedding")
_TERMINAL_STATES = tuple(s for s in MessageState if s.is_terminal and s != MessageState.manual)
_SWEEP_AGE = timedelta(minutes=10)  # answered long enough ago that no handler still reads it
_ABANDONED_WAIT_SECONDS = 600.0
_background: set[asyncio.Task[None]] = set()


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


def generation_failure(event: ErrorEvent) -> GenerationFailed:
    """The error to report for a terminal ``error`` event."""
    state = event.message.state.value if event.message is not None else "failed"
    return GenerationFailed(f"generation_{state}", f"the generation failed: {event.error or state}")


class OpenAIService:
    def __init__(
        self,
        settings: Settings,
        session_factory: async_sessionmaker[AsyncSession],
        fanout: StreamFanout,
        lifecycle: MessageLifecycle,
        registry: WorkerRegistry,
        submission: SubmissionService,
    ):
        self.settings = settings
        self._sessions = session_factory
        self._fanout = fanout
        self._lifecycle = lifecycle
        self._registry = registry
        self._submission = submission

    # ------------------------------------------------------------ models
    async def live_models(self, wanted: str | None = None) -> dict[str, LiveModel]:
        return await self._registry.live_models(wanted)

    async def resolve_model(self, name: str, kind: ModelKind) -> LiveModel:
        """The live model ``name`` of ``kind``: NotFound if unknown, ServiceUnavailable if no worker serves
        it now, InvalidRequest if it is of another kind."""
        live = await self._registry.live_models(wanted=name)
        model = live.get(name)
        available = ", ".join(sorted(n for n, m in live.items() if m.config.kind == kind)) or "none"
        if model is None:
            if name in self._registry.known_model_names(live):
                raise ServiceUnavailable(
                    "model_unavailable",
                    f"no worker serves the model {name!r} right now; available: {available}",
                    param="model",
                )
            raise NotFound(
                "model_not_found",
                f"the model {name!r} does not exist; available models: {available}",
                param="model",
            )
        if model.config.kind != kind:
            use = "/v1/embeddings" if model.config.kind == "embedding" else "/v1/chat/completions"
            raise InvalidRequest(
                "wrong_model_kind",
                f"{name!r} is a {model.config.kind} model: use {use} (available here: {available})",
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
    ) -> list[DbMessage]:
        """One message per choice (each with its sampling), admitted together: the caller's limits, as
        on the chat API, count every one. First the prompt must fit the model (``InvalidRequest``
        ``context_length_exceeded`` if the system prompt and the last message alone do not)."""
        if self._submission.prompt_fit is not None:
            offered = tools if tool_choice != "none" else None
            await self._submission.prompt_fit.check_chat_completion(
                model, system_prompt, thread, offered, tool_choice if offered else None
            )
        payload: dict[str, Any] = {"thread": [t.model_dump(mode="json", exclude_none=True) for t in thread]}
        if tools:
            payload["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in tools]
            payload["tool_choice"] = (
                tool_choice if isinstance(tool_choice, str | None) else tool_choice.model_dump(mode="json")
            )
        messages = [
            self._new_message(
                caller, "completion", model, sampling, dict(payload), system_prompt=system_prompt
            )
            for sampling in choices
        ]
        return await self._submit(session, caller, model, messages, thread)

    async def submit_completion(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        choices: Sequence[SamplingParameters],
        prompt: str,
    ) -> list[DbMessage]:
        """As :meth:`submit_chat`, for a raw prompt, which must fit the model whole."""
        if self._submission.prompt_fit is not None:
            await self._submission.prompt_fit.check_completion(model, prompt)
        messages = [
            self._new_message(caller, "completion", model, sampling, {"raw_prompt": prompt})
            for sampling in choices
        ]
        return await self._submit(session, caller, model, messages, [ChatTurn(role="user", content=prompt)])

    async def submit_embedding(
        self, session: AsyncSession, caller: Caller, model: LiveModel, inputs: list[str]
    ) -> DbMessage:
        message = self._new_message(caller, "embedding", model, None, {"inputs": inputs})
        (submitted,) = await self._submit(session, caller, model, [message])
        return submitted

    def _new_message(
        self,
        caller: Caller,
        kind: str,
        model: LiveModel,
        sampling: SamplingParameters | None,
        payload: dict[str, Any],
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
            request_payload=payload,
            enqueued_at=utcnow(),
        )

    @staticmethod
    def _store_as_chat(session: AsyncSession, message: DbMessage, thread: list[ChatTurn]) -> None:
        """Keep the conversation as a chat: its turns (user -> prompter), then the pending answer."""
        first_user = next((t.content for t in thread if t.role == "user"), "") or "API request"
        chat = DbChat(user_id=message.user_id, title=title_from_prompt(first_user))
        session.add(chat)
        parent_id: str | None = None
        for turn in thread:
            if turn.role in ("system", "tool"):
                continue  # no place in a chat for these turns; the request keeps them
            prompter = turn.role == "user"
            stored = DbMessage(
                chat_id=chat.id,
                parent_id=parent_id,
                role=Role.prompter if prompter else Role.assistant,
                content=turn.content,
                state=MessageState.manual if prompter else MessageState.complete,
            )
            session.add(stored)
            parent_id = stored.id
        message.chat_id = chat.id
        message.parent_id = parent_id
        message.created_at = message.enqueued_at = utcnow()  # after its turns, in the chat's order
        chat.active_thread_tail_message_id = message.id

    async def _submit(
        self,
        session: AsyncSession,
        caller: Caller,
        model: LiveModel,
        messages: list[DbMessage],
        thread: list[ChatTurn] | None = None,
    ) -> list[DbMessage]:
        """Admit, commit and queue the messages together; with ``store_api_conversations``, ``thread``
        as the chat of each (only added to the session here: its first write is admission's, which
        holds the user's turn)."""
        if thread is not None and self.settings.store_api_conversations:
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
        reader = read_message_events(
            self._lifecycle, self._fanout, self.settings, message, None, is_disconnected
        )
        async with aclosing(reader) as batches:
            async for batch in batches:
                yield [_decoded(entry["data"]) for entry in batch]

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
            await self.settle(message, finished, scrub=message.kind != "embedding")

    async def settle(self, message: DbMessage, finished: bool, *, scrub: bool = True) -> None:
        """After a request: cancel it if its client left before the end; erase what is not kept.

        Shielded, so it completes even while the request's task is being cancelled (a disconnect).
        """
        with anyio.CancelScope(shield=True):
            try:
                if not finished:
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
        """Erase the content of one answered request (and of the user's older ones left behind).

        One statement: the results always, and without ``store_api_conversations`` the text of the
        requests that are not kept as chats."""
        swept_before = utcnow() - _SWEEP_AGE
        owned = (DbMessage.user_id == message.user_id) & DbMessage.kind.in_(API_KINDS)
        finished = DbMessage.state.in_(_TERMINAL_STATES)
        this_or_old = (DbMessage.id == message.id) | (DbMessage.finished_at < swept_before)
        left = DbMessage.result_payload.is_not(None)
        values: dict[str, Any] = {"result_payload": null()}  # SQL NULL, not JSON null
        if not self.settings.store_api_conversations:
            unkept = DbMessage.chat_id.is_(None)
            text = (DbMessage.content, DbMessage.request_payload, DbMessage.system_prompt)
            left = left | (unkept & or_(*(column.is_not(None) for column in text)))
            values.update({column.key: case((unkept, null()), else_=column) for column in text})
        async with self._sessions() as session:
            await session.exec(update(DbMessage).where(owned, finished, this_or_old, left).values(**values))
            await session.commit()

    async def embeddings_of(self, message: DbMessage) -> tuple[list[list[float]], int]:
        """The vectors and prompt tokens of a finished embedding request (read before the scrub)."""
        current = await self._lifecycle.get(message.id)
        payload = (current.result_payload if current else None) or {}
        vectors = payload.get("embeddings")
        if current is None or not isinstance(vectors, list):
            raise GenerationFailed("embeddings_missing", "the worker returned no embeddings")
        return vectors, current.prompt_tokens or 0


def _spawn(coroutine: Coroutine[Any, Any, None], name: str) -> None:
    """Run a follow-up that outlives its request (kept referenced until done)."""
    task = asyncio.create_task(coroutine, name=name)
    _background.add(task)
    task.add_done_callback(_background.discard)
