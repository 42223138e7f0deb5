"""What the OpenAI adapter reads from an OpenAI-compatible server, as pydantic models.

Readers, not the API: they hold only the fields the adapter uses, ignore the rest, and accept each
server's variants (vLLM's ``stop_reason``, SGLang's ``matched_stop``, errors as ``{"error": {...}}`` or as
a top-level ``{"object": "error", ...}``). A field of an unexpected type reads as absent, as it would for
a server that does not send it. Our own OpenAI-compatible API is the server's
``oasst_inference_server.openai_protocol``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _mapping_or_none(value: Any) -> Any:
    return value if isinstance(value, dict) else None


OptionalInt = Annotated[int | None, BeforeValidator(_int_or_none)]
OptionalStr = Annotated[str | None, BeforeValidator(_str_or_none)]


class _Reader(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ServedModel(_Reader):
    id: OptionalStr = None
    max_model_len: OptionalInt = None  # vLLM


class ServedModelList(_Reader):
    data: list[Annotated[ServedModel | None, BeforeValidator(_mapping_or_none)]] = []

    @property
    def models(self) -> list[ServedModel]:
        return [model for model in self.data if model is not None]


class TokenizeAnswer(_Reader):
    """vLLM answers ``{"count", "tokens"}``, the llama.cpp server ``{"tokens"}``, llama-cpp-python
    ``{"count"}``."""

    count: OptionalInt = None
    tokens: Annotated[list[Any] | None, BeforeValidator(lambda v: v if isinstance(v, list) else None)] = None

    @property
    def token_count(self) -> int | None:
        if self.count is not None:
            return self.count
        return len(self.tokens) if self.tokens is not None else None

    @property
    def ids(self) -> list[int] | None:
        """The token ids, when the answer lists them as integers (the llama.cpp server lists
        ``{"id", "piece"}`` objects when asked for pieces)."""
        if self.tokens is None:
            return None
        ids: list[int] = []
        for token in self.tokens:
            token_id = token.get("id") if isinstance(token, dict) else token
            if not isinstance(token_id, int) or isinstance(token_id, bool):
                return None
            ids.append(token_id)
        return ids


class DetokenizeAnswer(_Reader):
    """vLLM answers ``{"prompt"}``, the llama.cpp server ``{"content"}``, llama-cpp-python ``{"text"}``."""

    prompt: OptionalStr = None
    content: OptionalStr = None
    text: OptionalStr = None

    @property
    def detokenized(self) -> str | None:
        return next((t for t in (self.prompt, self.content, self.text) if t is not None), None)


class ApiError(_Reader):
    message: Any = None
    detail: Any = None  # FastAPI-style servers
    type: Any = None
    code: Any = None

    def describe(self) -> str:
        return str(self.message or self.detail or self.model_dump(exclude_none=True))


class ErrorBody(ApiError):
    """An error answer: OpenAI's ``{"error": {...}}``, a bare ``{"error": "text"}``, or the fields at the
    top level."""

    error: ApiError | str | None = None

    @property
    def cause(self) -> ApiError | str:
        return self if self.error is None or self.error == "" else self.error


def _list_or_none(value: Any) -> Any:
    return value if isinstance(value, list) else None


class ToolCallFunctionDelta(_Reader):
    name: OptionalStr = None
    arguments: OptionalStr = None


class ToolCallDelta(_Reader):
    """A fragment of a streamed tool call: the first of each ``index`` names the call, the next ones
    carry pieces of its JSON arguments."""

    index: OptionalInt = None
    id: OptionalStr = None
    function: Annotated[ToolCallFunctionDelta | None, BeforeValidator(_mapping_or_none)] = None


class ChunkDelta(_Reader):
    content: OptionalStr = None
    tool_calls: Annotated[list[ToolCallDelta] | None, BeforeValidator(_list_or_none)] = None


class TopLogprobEntry(_Reader):
    token: OptionalStr = None
    logprob: float | None = None
    bytes: Annotated[list[int] | None, BeforeValidator(_list_or_none)] = None


class LogprobEntry(TopLogprobEntry):
    top_logprobs: Annotated[list[TopLogprobEntry] | None, BeforeValidator(_list_or_none)] = None


class ChunkLogprobs(_Reader):
    """``logprobs`` of a chunk's choice: ``content`` (chat), or the legacy completions lists."""

    content: Annotated[list[LogprobEntry] | None, BeforeValidator(_list_or_none)] = None
    tokens: Annotated[list[str] | None, BeforeValidator(_list_or_none)] = None
    token_logprobs: Annotated[list[float | None] | None, BeforeValidator(_list_or_none)] = None
    top_logprobs: Annotated[list[dict[str, float] | None] | None, BeforeValidator(_list_or_none)] = None


class ChunkChoice(_Reader):
    text: OptionalStr = None  # /v1/completions
    delta: Annotated[ChunkDelta | None, BeforeValidator(_mapping_or_none)] = None  # /v1/chat/completions
    finish_reason: OptionalStr = None
    # What stopped a "stop": a string is a stop sequence, a token id or null the end of sequence. Whether
    # the server sent the field at all matters (see finish_reason in openai.py): model_fields_set tells.
    stop_reason: str | int | None = None  # vLLM
    matched_stop: str | int | None = None  # SGLang
    logprobs: Annotated[ChunkLogprobs | None, BeforeValidator(_mapping_or_none)] = None

    def content(self, chat: bool) -> str:
        if chat:
            return (self.delta.content if self.delta is not None else None) or ""
        return self.text or ""


class ChunkUsage(_Reader):
    prompt_tokens: OptionalInt = None
    completion_tokens: OptionalInt = None


class CompletionChunk(ErrorBody):
    """One event of a streamed completion or chat completion; or an error reported mid-stream."""

    object: Any = None
    choices: Annotated[
        list[ChunkChoice] | None, BeforeValidator(lambda v: v if isinstance(v, list) else None)
    ] = None
    usage: Annotated[ChunkUsage | None, BeforeValidator(_mapping_or_none)] = None

    @property
    def is_error(self) -> bool:
        return "error" in self.model_fields_set or self.object == "error"
