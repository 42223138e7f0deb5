"""Anthropic requests into the internal request, and finished answers into Anthropic messages.

The internal request is the OpenAI-compatible API's :class:`ChatCompletionRequest`: its bounds, its
sampling parameters, its conversation (``to_thread``) and its tool handling serve both APIs. A message's
blocks become turns in order:

* ``system`` (a string or text blocks) -> the system prompt;
* a user message's text blocks -> one user turn; each ``tool_result`` -> a ``tool`` turn answering its
  ``tool_use_id`` (``is_error`` results say so in their text);
* an assistant message -> one assistant turn with its text and its ``tool_use`` blocks as tool calls
  (``input`` as the JSON arguments).

Tools become functions (``input_schema`` -> ``parameters``); ``tool_choice`` ``auto``/``any``/``tool``/
``none`` become ``auto``/``required``/the named function/``none``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from oasst_inference_server.anthropic_api.schemas import (
    CountTokensRequest,
    MessageResponse,
    MessagesRequest,
    StopReason,
    TextBlock,
    TextContent,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
    ToolUseContent,
    Usage,
)
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_shared.schemas import MessageRead
from oasst_shared.tool_calls import ToolCall

ERROR_RESULT_PREFIX = "Error: "


def message_id(internal_id: str) -> str:
    return f"msg_{internal_id}"


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` form of a call id (the history then names the call by it)."""
    return f"toolu_{call_id.removeprefix('call_')}"


def _tool_choice(request: CountTokensRequest) -> Any:
    choice = request.tool_choice
    if choice is None:
        return None
    if isinstance(choice, ToolChoiceNone):
        return "none"
    if isinstance(choice, ToolChoiceAny):
        return "required"
    if isinstance(choice, ToolChoiceTool):
        return {"type": "function", "function": {"name": choice.name}}
    return "auto"


def _openai_messages(request: CountTokensRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = request.system_text
    if system is not None:
        messages.append({"role": "system", "content": system})
    for message in request.messages:
        if message.role == "assistant":
            text = "".join(b.text for b in message.blocks if isinstance(b, TextBlock))
            calls = [
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
                }
                for b in message.blocks
                if isinstance(b, ToolUseBlock)
            ]
            messages.append({"role": "assistant", "content": text, "tool_calls": calls or None})
            continue
        texts: list[str] = []
        for block in message.blocks:
            if isinstance(block, ToolResultBlock):
                result = block.text
                if block.is_error:
                    result = ERROR_RESULT_PREFIX + result
                messages.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": result})
            elif isinstance(block, TextBlock):
                texts.append(block.text)
        if texts or not any(isinstance(b, ToolResultBlock) for b in message.blocks):
            messages.append({"role": "user", "content": "".join(texts)})
    return messages


def to_internal(request: CountTokensRequest) -> ChatCompletionRequest:
    """The internal request of an Anthropic one (a count's has the largest answer it could ask for)."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": _openai_messages(request),
        "tools": [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in request.tools or []
        ]
        or None,
        "tool_choice": _tool_choice(request),
    }
    if isinstance(request, MessagesRequest):
        body.update(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            stop=request.stop_sequences or None,
            stream=request.stream,
            user=request.metadata.user_id if request.metadata else None,
        )
        output = request.output_config.format if request.output_config else None
        if output is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": output.schema_},
            }
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise InvalidRequest("invalid_request", f"{where}: {message}" if where else message) from None


def stop_reason(
    final: MessageRead, stop_sequences: list[str] | None, max_tokens: int
) -> tuple[StopReason, str | None]:
    """Anthropic's stop reason of a finished answer, and the stop sequence that ended it. An answer cut
    short of ``max_tokens`` by the model's context is ``model_context_window_exceeded``.

    Workers report that a stop sequence ended an answer, not which one: with one stop sequence in the
    request that is the one; with several, ``stop_sequence`` is null (docs/anthropic-api.md).
    """
    if final.tool_calls:
        return "tool_use", None
    if final.finish_reason == "length":
        short = (final.generated_tokens or 0) < max_tokens
        return ("model_context_window_exceeded" if short else "max_tokens"), None
    if final.finish_reason == "stop_sequence" and stop_sequences:
        return "stop_sequence", stop_sequences[0] if len(stop_sequences) == 1 else None
    return "end_turn", None


def tool_use_blocks(calls: list[ToolCall]) -> list[ToolUseContent]:
    blocks = []
    for call in calls:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except ValueError:
            arguments = {}
        blocks.append(
            ToolUseContent(
                id=tool_use_id(call.id),
                name=call.function.name,
                input=arguments if isinstance(arguments, dict) else {},
            )
        )
    return blocks


def usage_of(final: MessageRead) -> Usage:
    # Anthropic counts cache reads apart from input_tokens (the three add up to the prompt).
    cached = final.cached_tokens or 0
    return Usage(
        input_tokens=(final.prompt_tokens or 0) - cached,
        output_tokens=final.generated_tokens or 0,
        cache_read_input_tokens=cached,
    )


def to_message(final: MessageRead, model: str, request: MessagesRequest) -> MessageResponse:
    """The Anthropic message of a finished answer: its text (if any, or if it made no call), its calls."""
    reason, sequence = stop_reason(final, request.stop_sequences, request.max_tokens)
    calls = final.tool_calls or []
    content: list[TextContent | ToolUseContent] = []
    if final.content or not calls:
        content.append(TextContent(text=final.content or ""))
    content.extend(tool_use_blocks(calls))
    return MessageResponse(
        id=message_id(final.id),
        model=model,
        content=content,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=usage_of(final),
    )
