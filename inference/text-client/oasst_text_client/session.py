"""One conversation: the chat on the server, where the next turn hangs, and asking for an answer.

Shared by the REPL and pipe mode, which differ only in how they show an answer (an ``AnswerSink``).
The next prompter message hangs under the last answer that can carry the conversation: a complete
one, or one cancelled part way (its partial text stays in the conversation, as in the web chat). A
failed turn, or one cancelled before it had any text, is left out: the next one branches from the
answer before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from contextlib import closing
from typing import Protocol

from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import (
    CreatedEvent,
    ErrorEvent,
    MessageEvent,
    MessageRead,
    MessageState,
    ModelConfigInfo,
    PendingEvent,
    RetryEvent,
    StreamEvent,
    TokenEvent,
)
from oasst_text_client._exceptions import (
    ApiError,
    GenerationFailed,
    ModelUnavailable,
    ProtocolError,
    TextClientError,
)
from oasst_text_client.api import ChatApiClient


class AnswerSink(Protocol):
    """Where the pieces of one streamed answer go."""

    def pending(self, queue_position: int, queue_size: int) -> None: ...

    def token(self, text: str) -> None: ...

    def restart(self, attempt: int, reason: str) -> None:
        """The server lost the worker: the text shown so far for this answer is void."""


def choose_model(models: list[ModelConfigInfo], wanted: str | None) -> ModelConfigInfo:
    """The named model, or the first one; ``ModelUnavailable`` listing the choices otherwise."""
    names = [m.name for m in models]
    if not models:
        raise ModelUnavailable("no model is available on the server (no worker is connected)", [])
    if wanted is None:
        return models[0]
    for model in models:
        if model.name == wanted:
            return model
    raise ModelUnavailable(f"unknown model {wanted!r}; available models: {', '.join(names)}", names)


def effective_sampling(model: ModelConfigInfo, overrides: dict[str, object]) -> SamplingParameters:
    """The model's first preset (the server's recommended defaults), with the user's flags on top."""
    base = model.parameter_configs[0].sampling_parameters if model.parameter_configs else SamplingParameters()
    merged = base.model_dump()
    merged.update(overrides)
    if overrides.get("do_sample") is False and "temperature" not in overrides:
        # A preset temperature means nothing under greedy decoding; drop it so the server sees one intent.
        merged["temperature"] = None
    return SamplingParameters.model_validate(merged)


# The states of an assistant message that the server accepts as the parent of the next prompter message.
REPLY_STATES = frozenset({MessageState.complete, MessageState.cancelled})
CANCEL_WAIT_S = 10.0


class ChatSession:
    def __init__(
        self,
        api: ChatApiClient,
        model_name: str,
        sampling: SamplingParameters,
        system_prompt: str | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api = api
        self._sleep = sleep
        self.model_name = model_name
        self.sampling = sampling
        self.system_prompt = system_prompt
        self.chat_id: str | None = None
        self._parent_id: str | None = None
        # The answer as the last cancel_current left it: cancelled, or complete if it won the race.
        self.last_cancelled: MessageRead | None = None
        self._turns_started = 0
        # Whether the server has POST /chats/{id}/turns (one call per turn); None until the first turn.
        self._turns_route: bool | None = None
        self.current: tuple[str, str] | None = None
        """(chat id, message id) of the answer being generated, for cancelling it."""

    def new_chat(self) -> None:
        """Forget the conversation; the next turn starts a new chat on the server."""
        self.chat_id = None
        self._parent_id = None
        self._turns_started = 0

    def ask(self, text: str, sink: AnswerSink) -> MessageRead:
        """Send one user turn and stream its answer into ``sink``.

        Returns the final message: complete, or cancelled (by another client) with its partial text.
        """
        if self.chat_id is None or (self._parent_id is None and self._turns_started > 0):
            # A chat whose every turn failed has no answer to hang the next turn under, and a second
            # root message is refused: start afresh.
            self.chat_id = self.api.create_chat().id
            self._parent_id = None
            self._turns_started = 0
        chat_id = self.chat_id
        self._turns_started += 1
        try:
            final = self._stream(chat_id, self._open_turn(chat_id, text), sink)
        except TextClientError:
            self.current = None
            raise
        # On KeyboardInterrupt ``current`` stays set, so that the caller can cancel the answer.
        self.current = None
        if _can_carry_the_conversation(final):
            self._parent_id = final.id
        return final

    def cancel_current(self, wait_s: float = CANCEL_WAIT_S) -> bool | None:
        """Cancel the answer in progress. None if there is none, False if the server cannot cancel.

        Waits up to ``wait_s`` for the worker to stop, so that the cancelled answer, with the text it
        had, can carry the next turn (the server refuses an unfinished parent).
        """
        if self.current is None:
            return None
        chat_id, message_id = self.current
        self.current = None
        if not self.api.cancel_message(chat_id, message_id):
            return False
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            message = self.api.get_message(chat_id, message_id)
            if message.state.is_terminal or time.monotonic() >= deadline:
                break
            self._sleep(delay)
            delay = min(0.5, delay * 2)
        self.last_cancelled = message
        if _can_carry_the_conversation(message):
            self._parent_id = message.id
        return True

    def _open_turn(self, chat_id: str, text: str) -> Generator[StreamEvent, None, None]:
        """The turn's events: in one call where the server has ``/turns``, else in three (the original
        server's routes). ``current`` is set as soon as the answer has an id."""
        if self._turns_route is not False:
            events = self.api.stream_turn(
                chat_id, text, self._parent_id, self.model_name, self.sampling, self.system_prompt
            )
            try:
                first = next(events)
            except ApiError as exc:
                if not _route_missing(exc):
                    raise
                self._turns_route = False
            else:
                self._turns_route = True
                if isinstance(first, CreatedEvent):
                    self.current = (chat_id, first.assistant_message.id)
                return _prepend(first, events)
        prompter = self.api.add_prompter_message(chat_id, text, self._parent_id)
        assistant = self.api.add_assistant_message(
            chat_id, prompter.id, self.model_name, self.sampling, self.system_prompt
        )
        self.current = (chat_id, assistant.id)
        return self.api.stream_events(chat_id, assistant.id)

    def _stream(
        self, chat_id: str, stream: Generator[StreamEvent, None, None], sink: AnswerSink
    ) -> MessageRead:
        with closing(stream) as events:
            for event in events:
                if isinstance(event, PendingEvent):
                    sink.pending(event.queue_position, event.queue_size)
                elif isinstance(event, TokenEvent):
                    sink.token(event.text)
                elif isinstance(event, RetryEvent):
                    sink.restart(event.attempt, event.reason)
                elif isinstance(event, MessageEvent):
                    message = event.message
                    if message.state not in REPLY_STATES:
                        reason = message.error or f"the answer ended in state {message.state.value}"
                        raise GenerationFailed(reason, message.state.value)
                    return message
                elif isinstance(event, ErrorEvent):
                    state = event.message.state.value if event.message is not None else None
                    raise GenerationFailed(event.error, state)
        raise ProtocolError("the event stream ended without a final event")  # pragma: no cover


def _prepend(
    first: StreamEvent, rest: Generator[StreamEvent, None, None]
) -> Generator[StreamEvent, None, None]:
    try:
        yield first
        yield from rest
    finally:
        rest.close()


def _route_missing(error: ApiError) -> bool:
    """A 404 or 405 that names no resource of ours: the server has no such route (an older one)."""
    return error.status_code in (404, 405) and error.code in (None, "not_found", "method_not_allowed")


def _can_carry_the_conversation(message: MessageRead) -> bool:
    """A complete answer, or a cancelled one with some text (one cancelled while queued has none)."""
    if message.state == MessageState.complete:
        return True
    return message.state == MessageState.cancelled and bool(message.content and message.content.strip())
