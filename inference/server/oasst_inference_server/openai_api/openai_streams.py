"""Streaming an OpenAI answer: a message's events as ``data: {chunk}`` lines, then ``data: [DONE]``.

Translation of the message events:

* ``pending``  -> an SSE comment with the queue position and estimated wait (keeps proxies and clients
  from timing out while queued);
* ``token``    -> a chunk with the text (and its tokens' logprobs, when asked for);
* ``retry``    -> nothing while no text was sent; after text was sent it cannot be taken back, so the
  stream ends with an error chunk (and the regeneration is cancelled);
* ``message``  -> for an answer that called tools, chunks with the ``tool_calls`` deltas (each call
  named in one, its arguments in fragments after it); a chunk with the finish reason, then (``stream_options.include_usage``) a chunk
  with the usage and no choices;
* ``error``    -> an error chunk ``{"error": {...}}``, which the OpenAI SDKs raise as ``APIError``.

If the client closes the stream, the generator is closed (or cancelled) and the message is cancelled
at its worker (:meth:`OpenAIService.settle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import anyio

from oasst_inference_server import events
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_inference_server.openai_api.openai_service import (
    IsDisconnected,
    OpenAIService,
    TokenText,
    generation_failure,
)
from oasst_inference_server.openai_api.stream_positions import ChunkIds
from oasst_inference_server.openai_protocol.errors import ErrorInfo, ErrorResponse
from oasst_inference_server.openai_protocol.generation_responses import (
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionStreamResponse,
    DeltaMessage,
    FunctionDelta,
    OpenAIFinishReason,
    ToolCallDelta,
    openai_finish_reason,
)
from oasst_inference_server.openai_protocol.usage import GenerationUsage
from oasst_shared.logprobs import TokenLogprob
from oasst_shared.schemas import (
    ErrorEvent,
    MessageEvent,
    MessageRead,
    PendingEvent,
    RetryEvent,
    StreamEvent,
    TokenEvent,
)
from oasst_shared.tool_calls import ToolCall

DONE = "data: [DONE]\n\n"


def pending_comment(event: PendingEvent) -> str:
    loading = ", waiting for a worker to load the model" if event.loading_model else ""
    text = f": pending{loading}, queue position {event.queue_position} of {event.queue_size}"
    wait = event.estimated_wait_seconds
    if wait is not None:
        text += f", estimated wait {wait:.0f}s"
    return text + "\n\n"


def pending_comment_line(event: PendingEvent) -> str:
    """The pending comment of a stream with ids: one line, no blank line after it. The OpenAI Python SDK
    keeps the last id it saw (as the SSE spec says) and so turns every blank line after it into an
    event, with empty data it cannot parse; a comment without one is only a line it skips."""
    return pending_comment(event)[:-1]


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def error_chunk(message: str, code: str, error_type: str = "server_error") -> str:
    return sse(ErrorResponse(error=ErrorInfo(message=message, type=error_type, code=code)).model_dump())


_SLOT = "\x00text\x00"  # stands for the text in a stream's text chunk template
_ARGUMENT_FRAGMENT = 24  # characters of a tool call's arguments per streamed delta


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass
class _Chunks:
    """The chunks of one streamed answer. Text chunks differ only in their text, so one is rendered
    with a placeholder and each token's text is put in its place (no models built per token)."""

    id: str
    created: int
    model: str
    index: int = 0  # of the choice, with n > 1

    def __post_init__(self) -> None:
        self._offset = 0  # characters of text sent so far
        text_chunk = self._chunk([self._choice(_SLOT, None)])
        self._text_head, _, self._text_tail = text_chunk.rpartition(_json_string(_SLOT))

    def _chunk(self, choices: list[Any], usage: GenerationUsage | None = None) -> str:
        raise NotImplementedError

    def _choice(
        self, text: str | None, reason: OpenAIFinishReason | None, logprobs: list[TokenLogprob] | None = None
    ) -> Any:
        raise NotImplementedError

    def start(self) -> str | None:
        return None

    def text_json(self, text: str) -> str:
        """The chunk of a text given as a JSON string (a stored token event's, :class:`TokenText`)."""
        # Its length in characters: the JSON string's, less its quotes, unless it has escapes.
        self._offset += len(text) - 2 if "\\" not in text else len(json.loads(text))
        return f"{self._text_head}{text}{self._text_tail}"

    def text(self, text: str, logprobs: list[TokenLogprob] | None = None) -> str:
        if logprobs:  # built in full: the template has no logprobs
            chunk = self._chunk([self._choice(text, None, logprobs)])
        else:
            chunk = f"{self._text_head}{_json_string(text)}{self._text_tail}"
        self._offset += len(text)
        return chunk

    def tool_calls(self, calls: list[ToolCall]) -> list[str]:
        return []

    def finish(self, reason: OpenAIFinishReason) -> str:
        return self._chunk([self._choice(None, reason)])

    def usage(self, usage: GenerationUsage) -> str:
        return self._chunk([], usage)


class ChatChunks(_Chunks):
    def _chunk(self, choices: list[ChatCompletionStreamChoice], usage: GenerationUsage | None = None) -> str:
        chunk = ChatCompletionStreamResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        ).model_dump(mode="json")
        for choice in chunk["choices"]:  # OpenAI sends only the delta fields that are set
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
            for call in choice["delta"].get("tool_calls") or []:
                for key in [k for k, v in call.items() if v is None]:
                    del call[key]
                call["function"] = {k: v for k, v in call["function"].items() if v is not None}
        return sse(chunk)

    def _choice(
        self, text: str | None, reason: OpenAIFinishReason | None, logprobs: list[TokenLogprob] | None = None
    ) -> ChatCompletionStreamChoice:
        return ChatCompletionStreamChoice(
            index=self.index,
            delta=DeltaMessage(content=text),
            finish_reason=reason,
            logprobs=ChoiceLogprobs(content=logprobs) if logprobs is not None else None,
        )

    def tool_calls(self, calls: list[ToolCall]) -> list[str]:
        """OpenAI's contract: per call, a delta with its index, id, type and name (empty arguments), then
        deltas with fragments of its arguments."""
        out: list[str] = []
        for index, call in enumerate(calls):
            head = ToolCallDelta(
                index=index,
                id=call.id,
                type="function",
                function=FunctionDelta(name=call.function.name, arguments=""),
            )
            out.append(self._tool_chunk(head))
            arguments = call.function.arguments
            for start in range(0, len(arguments), _ARGUMENT_FRAGMENT):
                fragment = arguments[start : start + _ARGUMENT_FRAGMENT]
                out.append(
                    self._tool_chunk(ToolCallDelta(index=index, function=FunctionDelta(arguments=fragment)))
                )
        return out

    def _tool_chunk(self, delta: ToolCallDelta) -> str:
        choice = ChatCompletionStreamChoice(index=self.index, delta=DeltaMessage(tool_calls=[delta]))
        return self._chunk([choice])

    def start(self) -> str | None:
        start = ChatCompletionStreamChoice(index=self.index, delta=DeltaMessage(role="assistant", content=""))
        return self._chunk([start])


class CompletionChunks(_Chunks):
    def _chunk(self, choices: list[CompletionChoice], usage: GenerationUsage | None = None) -> str:
        return sse(
            CompletionStreamResponse(
                id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
            ).model_dump(mode="json")
        )

    def _choice(
        self, text: str | None, reason: OpenAIFinishReason | None, logprobs: list[TokenLogprob] | None = None
    ) -> CompletionChoice:
        return CompletionChoice(
            index=self.index,
            text=text or "",
            finish_reason=reason,
            logprobs=CompletionLogprobs.of(logprobs, self._offset) if logprobs is not None else None,
        )


async def stream_answer(
    service: OpenAIService,
    message: DbMessage,
    chunks: _Chunks,
    *,
    include_usage: bool,
    is_disconnected: IsDisconnected,
    ids: ChunkIds,
) -> AsyncGenerator[str, None]:
    """One answer's chunks, each with its id (:mod:`.stream_positions`); a resumed stream's ``ids`` drop
    the chunks its client already has. Rendered from the first event either way, so a resumed stream's
    chunks are the ones the first stream had."""
    finished = False
    sent_text = False
    try:
        if (first := chunks.start()) and (opening := ids.opening(first)):
            yield opening
        async with contextlib.aclosing(service.positioned_events(message, is_disconnected)) as batches:
            async for batch in batches:
                # One write per batch of events: a stream that fell behind catches up in one send.
                out: list[str] = []
                for entry_id, event in batch:
                    chunk: str | None = None
                    if type(event) is TokenText:
                        sent_text = True
                        chunk = chunks.text_json(event.json)
                    elif isinstance(event, TokenEvent):
                        sent_text = True
                        chunk = chunks.text(event.text, event.logprobs)
                    elif isinstance(event, PendingEvent):
                        if entry_id is None or ids.is_new(entry_id):  # a comment: it can have no id
                            out.append(pending_comment_line(event))
                    elif isinstance(event, MessageEvent | ErrorEvent) or (
                        isinstance(event, RetryEvent) and sent_text
                    ):
                        # A retry after text was sent is not finished: settle() cancels the
                        # regeneration nobody would read.
                        finished = events.is_terminal_type(event.event_type)
                        closing = [*_closing_chunks(event, chunks, include_usage), DONE]
                        yield "".join([*out, *ids.frame(entry_id, closing)])
                        return
                    if chunk is not None:
                        if entry_id is None:
                            out.append(chunk)
                        elif framed := ids.one(entry_id, chunk):
                            out.append(framed)
                if out:
                    yield "".join(out)
    finally:
        await service.settle(message, finished, resumable=True)


async def stream_choices(
    service: OpenAIService,
    messages: list[DbMessage],
    chunks: list[_Chunks],
    *,
    include_usage: bool,
    is_disconnected: IsDisconnected,
) -> AsyncGenerator[str, None]:
    """Several choices (``n`` > 1, one message each) in one stream, their chunks interleaved as their
    events come; ``[DONE]`` after the last one ends. A failed choice ends the whole stream with an error
    chunk, and the other choices are cancelled."""
    queue: asyncio.Queue[tuple[int, list[StreamEvent | TokenText] | None]] = asyncio.Queue()

    async def pump(index: int) -> None:
        try:
            async with contextlib.aclosing(service.events(messages[index], is_disconnected)) as batches:
                async for batch in batches:
                    await queue.put((index, batch))
        finally:
            await queue.put((index, None))

    finished = [False] * len(messages)
    sent_text = [False] * len(messages)
    finals: list[MessageRead] = []
    pumps = [asyncio.create_task(pump(i)) for i in range(len(messages))]
    try:
        yield "".join(c.start() or "" for c in chunks)
        open_choices = len(messages)
        while open_choices:
            index, batch = await queue.get()
            if batch is None:
                open_choices -= 1
                if not finished[index]:
                    return  # its reader stopped (the client left): settle() cancels the others
                continue
            out: list[str] = []
            for event in batch:
                if type(event) is TokenText:
                    sent_text[index] = True
                    out.append(chunks[index].text_json(event.json))
                elif isinstance(event, TokenEvent):
                    sent_text[index] = True
                    out.append(chunks[index].text(event.text, event.logprobs))
                elif isinstance(event, PendingEvent):
                    out.append(pending_comment(event))
                elif isinstance(event, MessageEvent):
                    finished[index] = True
                    finals.append(event.message)
                    out.extend(_closing_chunks(event, chunks[index], include_usage=False))
                elif isinstance(event, ErrorEvent) or (isinstance(event, RetryEvent) and sent_text[index]):
                    finished[index] = isinstance(event, ErrorEvent)
                    yield "".join([*out, *_closing_chunks(event, chunks[index], include_usage=False), DONE])
                    return
            if out:
                yield "".join(out)
        closing = [chunks[0].usage(GenerationUsage.of_answers(finals))] if include_usage else []
        yield "".join([*closing, DONE])
    finally:
        for task in pumps:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*pumps, return_exceptions=True)
            for message, done in zip(messages, finished, strict=True):
                await service.settle(message, done)


def _closing_chunks(
    event: MessageEvent | ErrorEvent | RetryEvent, chunks: _Chunks, include_usage: bool
) -> list[str]:
    """The chunks that end a stream (before ``[DONE]``) for a terminal event, or a retry after text."""
    if isinstance(event, MessageEvent):
        final = event.message
        calls = final.tool_calls or []
        closing = [
            *chunks.tool_calls(calls),
            chunks.finish(openai_finish_reason(final.finish_reason, bool(calls))),
        ]
        if include_usage:
            closing.append(chunks.usage(GenerationUsage.of_answers([final])))
        return closing
    if isinstance(event, ErrorEvent):
        failure = generation_failure(event)
        kind = "invalid_request_error" if isinstance(failure, InvalidRequest) else "server_error"
        return [error_chunk(failure.detail, failure.code, kind)]
    return [
        error_chunk(
            f"the worker generating this answer was lost ({event.reason}); "
            "the text already sent cannot be taken back: retry the request",
            "worker_lost",
        )
    ]
