"""Streaming an OpenAI answer: a message's events as ``data: {chunk}`` lines, then ``data: [DONE]``.

Translation of the message events:

* ``pending``  -> an SSE comment with the queue position and estimated wait (keeps proxies and clients
  from timing out while queued);
* ``token``    -> a chunk with the text;
* ``retry``    -> nothing while no text was sent; after text was sent it cannot be taken back, so the
  stream ends with an error chunk (and the regeneration is cancelled);
* ``message``  -> a chunk with the finish reason, then (``stream_options.include_usage``) a chunk
  with the usage and no choices;
* ``error``    -> an error chunk ``{"error": {...}}``, which the OpenAI SDKs raise as ``APIError``.

If the client closes the stream, the generator is closed (or cancelled) and the message is cancelled
at its worker (:meth:`OpenAIService.settle`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.openai_api.openai_service import IsDisconnected, OpenAIService, generation_failure
from oasst_shared.openai_schemas import (
    ChatCompletionStreamChoice,
    ChatCompletionStreamResponse,
    CompletionChoice,
    CompletionStreamResponse,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    OpenAIFinishReason,
    UsageInfo,
    openai_finish_reason,
)
from oasst_shared.schemas import MessageRead

DONE = "data: [DONE]\n\n"


def pending_comment(event: dict[str, Any]) -> str:
    text = f": pending, queue position {event.get('queue_position')} of {event.get('queue_size')}"
    wait = event.get("estimated_wait_seconds")
    if wait is not None:
        text += f", estimated wait {wait:.0f}s"
    return text + "\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def error_chunk(message: str, code: str, error_type: str = "server_error") -> str:
    return sse(ErrorResponse(error=ErrorInfo(message=message, type=error_type, code=code)).model_dump())


_SLOT = "\x00text\x00"  # stands for the text in a stream's text chunk template


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass
class _Chunks:
    """The chunks of one streamed answer. Text chunks differ only in their text, so one is rendered
    with a placeholder and each token's text is put in its place (no models built per token)."""

    id: str
    created: int
    model: str

    def __post_init__(self) -> None:
        text_chunk = self._chunk([self._choice(_SLOT, None)])
        self._text_head, _, self._text_tail = text_chunk.rpartition(_json_string(_SLOT))

    def _chunk(self, choices: list[Any], usage: UsageInfo | None = None) -> str:
        raise NotImplementedError

    def _choice(self, text: str | None, reason: OpenAIFinishReason | None) -> Any:
        raise NotImplementedError

    def start(self) -> str | None:
        return None

    def text(self, text: str) -> str:
        return f"{self._text_head}{_json_string(text)}{self._text_tail}"

    def finish(self, reason: OpenAIFinishReason) -> str:
        return self._chunk([self._choice(None, reason)])

    def usage(self, usage: UsageInfo) -> str:
        return self._chunk([], usage)


class ChatChunks(_Chunks):
    def _chunk(self, choices: list[ChatCompletionStreamChoice], usage: UsageInfo | None = None) -> str:
        chunk = ChatCompletionStreamResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        ).model_dump(mode="json")
        for choice in chunk["choices"]:  # OpenAI sends only the delta fields that are set
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
        return sse(chunk)

    def _choice(self, text: str | None, reason: OpenAIFinishReason | None) -> ChatCompletionStreamChoice:
        return ChatCompletionStreamChoice(delta=DeltaMessage(content=text), finish_reason=reason)

    def start(self) -> str | None:
        return self._chunk([ChatCompletionStreamChoice(delta=DeltaMessage(role="assistant", content=""))])


class CompletionChunks(_Chunks):
    def _chunk(self, choices: list[CompletionChoice], usage: UsageInfo | None = None) -> str:
        return sse(
            CompletionStreamResponse(
                id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
            ).model_dump(mode="json")
        )

    def _choice(self, text: str | None, reason: OpenAIFinishReason | None) -> CompletionChoice:
        return CompletionChoice(text=text or "", finish_reason=reason)


async def stream_answer(
    service: OpenAIService,
    message: DbMessage,
    chunks: _Chunks,
    *,
    include_usage: bool,
    is_disconnected: IsDisconnected,
) -> AsyncGenerator[str, None]:
    finished = False
    sent_text = False
    try:
        if first := chunks.start():
            yield first
        async with contextlib.aclosing(service.events(message.id, is_disconnected)) as batches:
            async for batch in batches:
                # One write per batch of events: a stream that fell behind catches up in one send.
                out: list[str] = []
                for event in batch:
                    kind = event["event_type"]
                    if kind == "token":
                        sent_text = True
                        out.append(chunks.text(event["text"]))
                    elif kind == "pending":
                        out.append(pending_comment(event))
                    elif kind in ("message", "error") or (kind == "retry" and sent_text):
                        # A retry after text was sent is not finished: settle() cancels the
                        # regeneration nobody would read.
                        finished = kind != "retry"
                        yield "".join([*out, *_closing_chunks(event, chunks, include_usage), DONE])
                        return
                if out:
                    yield "".join(out)
    finally:
        await service.settle(message, finished)


def _closing_chunks(event: dict[str, Any], chunks: _Chunks, include_usage: bool) -> list[str]:
    """The chunks that end a stream (before ``[DONE]``) for a terminal event, or a retry after text."""
    kind = event["event_type"]
    if kind == "message":
        final = MessageRead.model_validate(event["message"])
        closing = [chunks.finish(openai_finish_reason(final.finish_reason))]
        if include_usage:
            closing.append(chunks.usage(UsageInfo.of(final.prompt_tokens, final.generated_tokens)))
        return closing
    if kind == "error":
        failure = generation_failure(event)
        return [error_chunk(failure.detail, failure.code)]
    return [
        error_chunk(
            f"the worker generating this answer was lost ({event.get('reason')}); "
            "the text already sent cannot be taken back: retry the request",
            "worker_lost",
        )
    ]


class OpenAIStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that always closes its generator, shielded.

    Starlette stops iterating when the client disconnects but leaves closing the generator to the
    garbage collector; closing it here runs its ``finally`` (the cancel) at once.
    """

    def __init__(self, content: AsyncGenerator[str, None], headers: dict[str, str] | None = None):
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._generator = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._generator.aclose()
