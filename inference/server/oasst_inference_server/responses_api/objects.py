"""Response objects in OpenAI's shape: the stored request they repeat, their output items, usage.

A response is one :class:`~oasst_inference_server.db.models.DbMessage` (``kind`` "response"); its id is
``resp_`` and the message's id. What the object repeats of its request (instructions, tools, text format,
sampling, metadata, input items) is stored with the message as :class:`StoredRequest`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from oasst_inference_server.db.models import MessageKind
from oasst_inference_server.responses_api.wire import MAX_ITEM_ID, RESPONSE_ID_PREFIX
from oasst_shared.schemas import MessageRead, MessageState

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
RESPONSE_KIND = MessageKind.response  # DbMessage.kind of a stored response
_MESSAGE_ID = re.compile(rf"^[A-Za-z0-9-]{{1,{MAX_ITEM_ID}}}$")


class StoredRequest(BaseModel):
    """What a response object repeats of its request, kept in the message's ``request_payload``."""

    model_config = ConfigDict(extra="ignore")

    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    text_format: dict[str, Any] = Field(default_factory=lambda: {"type": "text"})
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    previous_response_id: str | None = None
    background: bool = False
    store: bool = True
    user: str | None = None
    input_items: list[dict[str, Any]] = Field(default_factory=list)


def response_id(message_id: str) -> str:
    return f"{RESPONSE_ID_PREFIX}{message_id}"


def message_id_of(response: str) -> str | None:
    """The message id in a response id, or None if it cannot be one of ours."""
    if not response.startswith(RESPONSE_ID_PREFIX):
        return None
    message_id = response[len(RESPONSE_ID_PREFIX) :]
    return message_id if _MESSAGE_ID.fullmatch(message_id) else None


def message_item_id(message_id: str) -> str:
    return f"msg_{message_id.replace('-', '')}"


def call_item_id(message_id: str, index: int) -> str:
    return f"fc_{message_id.replace('-', '')}_{index}"


def status_of(message: MessageRead) -> ResponseStatus:
    state = message.state
    if state == MessageState.pending:
        return "queued"
    if state == MessageState.in_progress:
        return "in_progress"
    if state == MessageState.cancelled:
        return "cancelled"
    if state == MessageState.complete:
        return "incomplete" if message.finish_reason == "length" and not message.tool_calls else "completed"
    return "failed"


def text_item(message_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": message_item_id(message_id),
        "status": status,
        "role": "assistant",
        "content": [text_part(text)] if status == "completed" else [],
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(
    message_id: str, index: int, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": call_item_id(message_id, index),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(final: MessageRead) -> list[dict[str, Any]]:
    """The output of a finished message: its text (unless it only called tools), then its calls."""
    calls = final.tool_calls or []
    items = [] if calls and not final.content else [text_item(final.id, final.content or "")]
    items.extend(
        call_item(final.id, i, c.id, c.function.name, c.function.arguments, "completed")
        for i, c in enumerate(calls)
    )
    return items


def usage_of(message: MessageRead) -> dict[str, Any] | None:
    if message.prompt_tokens is None and message.generated_tokens is None:
        return None
    prompt, generated = message.prompt_tokens or 0, message.generated_tokens or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": message.cached_tokens or 0},
        "output_tokens": generated,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + generated,
    }


def response_object(
    message: MessageRead,
    model: str,
    stored: StoredRequest,
    *,
    status: ResponseStatus | None = None,
    output: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The response object of ``message`` (its own status and output unless given: a stream's
    snapshots show the status and items of their moment)."""
    status = status or status_of(message)
    terminal = status in ("completed", "incomplete", "failed", "cancelled")
    if output is None:
        output = output_items(message) if status in ("completed", "incomplete") else []
    error = None
    if status == "failed":
        error = {"code": "server_error", "message": message.error or "the generation failed"}
    return {
        "id": response_id(message.id),
        "object": "response",
        "created_at": int(message.created_at.timestamp()),
        "status": status,
        "background": stored.background,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": stored.instructions,
        "max_output_tokens": stored.max_output_tokens,
        "metadata": stored.metadata,
        "model": model,
        "output": output,
        "parallel_tool_calls": stored.parallel_tool_calls,
        "previous_response_id": stored.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": stored.store,
        "temperature": stored.temperature,
        "text": {"format": stored.text_format},
        "tool_choice": stored.tool_choice,
        "tools": stored.tools,
        "top_p": stored.top_p,
        "truncation": "disabled",
        "usage": usage_of(message) if terminal else None,
        "user": stored.user,
    }
