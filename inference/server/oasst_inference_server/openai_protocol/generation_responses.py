"""The answers of ``/v1/chat/completions`` and ``/v1/completions``, whole and as streamed chunks."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from oasst_inference_server.openai_protocol.usage import GenerationUsage
from oasst_shared.logprobs import TokenLogprob
from oasst_shared.tool_calls import ToolCall

OpenAIFinishReason = Literal["stop", "length", "tool_calls", "content_filter"]

_FINISH_REASONS: dict[str, OpenAIFinishReason] = {
    "eos_token": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "cancelled": "stop",
    "content_filter": "content_filter",  # the moderation hook cut or replaced the answer
}


def openai_finish_reason(finish_reason: str | None, tool_calls: bool = False) -> OpenAIFinishReason:
    """The OpenAI name of one of our finish reasons (``oasst_shared.protocol.FinishReason``)."""
    if tool_calls:
        return "tool_calls"
    return _FINISH_REASONS.get(finish_reason or "", "stop")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: OpenAIFinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: GenerationUsage
    system_fingerprint: str | None = None


class FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str


class ToolCallDelta(BaseModel):
    """A streamed piece of a tool call: the first names it (``id``, ``type``, ``function.name``), the
    next ones carry fragments of ``function.arguments``."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: OpenAIFinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionStreamResponse(BaseModel):
    """One chunk of a streamed chat completion (``object="chat.completion.chunk"``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: GenerationUsage | None = None
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)

    @classmethod
    def of(cls, entries: list[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
        result = cls()
        for entry in entries:
            result.tokens.append(entry.token)
            result.token_logprobs.append(entry.logprob)
            result.top_logprobs.append({t.token: t.logprob for t in entry.top_logprobs})
            result.text_offset.append(offset)
            offset += len(entry.token)
        return result


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: OpenAIFinishReason | None = None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    """A completion, and also one chunk of a streamed completion (the same object in OpenAI's API)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: GenerationUsage | None = None
    system_fingerprint: str | None = None


CompletionStreamResponse = CompletionResponse
