"""Streaming an Anthropic answer: a message's events as Anthropic's server-sent events.

The sequence (each ``event: <type>`` line with its ``data: {json}``):

* ``message_start`` (the message with no content yet), then a ``ping``;
* ``pending`` message events -> ``ping`` (keeps proxies and clients from timing out while queued);
* the first ``token`` -> ``content_block_start`` of a text block (index 0); every token ->
  ``content_block_delta`` with a ``text_delta``;
* ``message`` -> ``content_block_stop`` of the text block; per tool call a ``tool_use`` block
  (``content_block_start`` with empty ``input``, ``content_block_delta`` events with ``input_json_delta``
  fragments, ``content_block_stop``); an answer with neither text nor calls has one empty text block;
  then ``message_delta`` with the stop reason, stop sequence and usage, and ``message_stop``;
* ``error`` (and a ``retry`` after text was sent, which cannot be taken back) -> an ``error`` event in
  Anthropic's error shape; the stream ends there.

If the client closes the stream, the generator is closed and the message is cancelled at its worker.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any

from oasst_inference_server import events
from oasst_inference_server.anthropic_api.anthropic_service import AnthropicService, Submitted
from oasst_inference_server.anthropic_api.conversion import message_id, stop_reason, tool_use_blocks
from oasst_inference_server.anthropic_api.errors import error_body
from oasst_inference_server.anthropic_api.schemas import MessageResponse, MessagesRequest, Usage
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_inference_server.openai_api.openai_service import IsDisconnected, TokenText, generation_failure
from oasst_shared.schemas import (
    ErrorEvent,
    MessageEvent,
    MessageRead,
    PendingEvent,
    RetryEvent,
    TokenEvent,
)

_ARGUMENT_FRAGMENT = 24  # characters of a tool call's input JSON per input_json_delta
PING = 'event: ping\ndata: {"type":"ping"}\n\n'
# Every text delta of a stream is this with the text (a JSON string) between head and tail.
_TEXT_HEAD = 'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
_TEXT_TAIL = "}}\n\n"


def sse(event_type: str, payload: dict[str, Any]) -> str:
    data = json.dumps({"type": event_type, **payload}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event_type}\ndata: {data}\n\n"


def error_event(status_code: int, message: str) -> str:
    _, body = error_body(status_code, message)
    return sse("error", {"error": body.error.model_dump(), "request_id": body.request_id})


def message_start(submitted: Submitted) -> str:
    skeleton = MessageResponse(
        id=message_id(submitted.message.id),
        model=submitted.model.config.name,
        content=[],
        stop_reason=None,
        usage=Usage(),
    )
    return sse("message_start", {"message": skeleton.model_dump(mode="json")})


def _block_start(index: int, block: dict[str, Any]) -> str:
    return sse("content_block_start", {"index": index, "content_block": block})


def _block_stop(index: int) -> str:
    return sse("content_block_stop", {"index": index})


def closing_events(final: MessageRead, text_open: bool, request: MessagesRequest) -> list[str]:
    """The events after the last text delta: the blocks' ends, the tool calls, the stop reason, usage."""
    out: list[str] = []
    calls = tool_use_blocks(final.tool_calls or [])
    index = 0
    if text_open:
        out.append(_block_stop(0))
        index = 1
    elif not calls:
        out += [_block_start(0, {"type": "text", "text": ""}), _block_stop(0)]
    for call in calls:
        out.append(_block_start(index, {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}))
        arguments = json.dumps(call.input, ensure_ascii=False)
        for start in range(0, len(arguments), _ARGUMENT_FRAGMENT):
            fragment = arguments[start : start + _ARGUMENT_FRAGMENT]
            delta = {"type": "input_json_delta", "partial_json": fragment}
            out.append(sse("content_block_delta", {"index": index, "delta": delta}))
        out.append(_block_stop(index))
        index += 1
    reason, sequence = stop_reason(final, request.stop_sequences, request.max_tokens)
    usage = {"input_tokens": final.prompt_tokens or 0, "output_tokens": final.generated_tokens or 0}
    out.append(
        sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage})
    )
    out.append(sse("message_stop", {}))
    return out


def _failure_event(event: ErrorEvent | RetryEvent) -> str:
    if isinstance(event, ErrorEvent):
        failure = generation_failure(event)
        # A request the model's backend refused as invalid is the caller's fault, any other failure ours.
        return error_event(400 if isinstance(failure, InvalidRequest) else 500, failure.detail)
    return error_event(
        500,
        f"the worker generating this answer was lost ({event.reason}); the text already sent cannot be "
        "taken back: retry the request",
    )


def _text_delta(event: TokenText | TokenEvent) -> str:
    # A stored token's text is already a JSON string: it goes in as it is, without a decode.
    text = event.json if isinstance(event, TokenText) else json.dumps(event.text, ensure_ascii=False)
    return f"{_TEXT_HEAD}{text}{_TEXT_TAIL}"


async def stream_message(
    service: AnthropicService, submitted: Submitted, is_disconnected: IsDisconnected
) -> AsyncGenerator[str, None]:
    finished = False
    text_open = False
    try:
        yield message_start(submitted) + PING
        reader = service.openai.events(submitted.message, is_disconnected)
        async with contextlib.aclosing(reader) as batches:
            async for batch in batches:
                # One write per batch of events: a stream that fell behind catches up in one send.
                out: list[str] = []
                for event in batch:
                    if type(event) is TokenText or isinstance(event, TokenEvent):
                        if not text_open:
                            text_open = True
                            out.append(_block_start(0, {"type": "text", "text": ""}))
                        out.append(_text_delta(event))
                    elif isinstance(event, PendingEvent):
                        out.append(PING)
                    elif isinstance(event, MessageEvent):
                        finished = True
                        closing = closing_events(event.message, text_open, submitted.request)
                        yield "".join([*out, *closing])
                        return
                    elif isinstance(event, ErrorEvent) or (isinstance(event, RetryEvent) and text_open):
                        # A retry after text was sent is not finished: settle() cancels the regeneration.
                        finished = events.is_terminal_type(event.event_type)
                        yield "".join([*out, _failure_event(event)])
                        return
                if out:
                    yield "".join(out)
    finally:
        await service.openai.settle(submitted.message, finished)
