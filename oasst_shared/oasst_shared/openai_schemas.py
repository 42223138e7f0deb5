"""The OpenAI-compatible wire format: the subset of the OpenAI API this service speaks.

Requests ignore unknown fields (SDKs and tools send many optional ones) but refuse, with a message
naming the parameter, options the service cannot honour (``n`` > 1, logprobs, tools, JSON modes,
logit_bias, penalties): silently dropping them would answer a different question than the one asked.
Requests convert themselves to :class:`~oasst_shared.sampling.SamplingParameters` and to the
conversation a worker renders (``to_sampling_parameters``, ``to_thread``).
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from oasst_shared.protocol import ChatTurn
from oasst_shared.sampling import MAX_STOP_SEQUENCES, SamplingParameters

OpenAIFinishReason = Literal["stop", "length"]
MAX_PROMPT_CHARACTERS = 256_000  # the whole request; the worker truncates to the model's context
MAX_EMBEDDING_INPUTS = 2048

_FINISH_REASONS: dict[str, OpenAIFinishReason] = {
    "eos_token": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "cancelled": "stop",
}


def openai_finish_reason(finish_reason: str | None) -> OpenAIFinishReason:
    """The OpenAI name of one of our finish reasons (``oasst_shared.protocol.FinishReason``)."""
    return _FINISH_REASONS.get(finish_reason or "", "stop")


def encode_embedding_base64(vector: list[float]) -> str:
    """``encoding_format="base64"``: little-endian float32, as the OpenAI SDK decodes it."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


# ---------------------------------------------------------------- requests


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class StreamOptions(_Request):
    include_usage: bool = False


class _GenerationRequest(_Request):
    """Parameters shared by chat completions and completions."""

    model: str = Field(min_length=1, max_length=128)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    # Extensions that vLLM and TGI also accept; top_k <= 0 means "off" (vLLM uses -1).
    top_k: int | None = None
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=100.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**64 - 1)
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are supported")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("presence and frequency penalties are not supported (try repetition_penalty)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def to_sampling_parameters(self, default_max_tokens: int) -> SamplingParameters:
        """Our sampling parameters; ``temperature=0`` (or ``top_p=0``) means greedy decoding.

        ``default_max_tokens`` applies when the request sets no limit (the model's context length:
        the worker caps it to what the prompt leaves).
        """
        greedy = self.temperature == 0.0 or self.top_p == 0.0
        max_tokens = self.requested_max_tokens() or default_max_tokens
        return SamplingParameters(
            temperature=None if greedy else self.temperature,
            top_p=None if greedy or self.top_p is None or self.top_p >= 1.0 else self.top_p,
            top_k=None if greedy or self.top_k is None or self.top_k <= 0 else self.top_k,
            repetition_penalty=self.repetition_penalty,
            max_new_tokens=min(max_tokens, 65536),
            seed=self.seed,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            do_sample=not greedy,
        )


class TextContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessage(_Request):
    role: str
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value in ("tool", "function"):
            raise ValueError(f"role {value!r} is not supported: this server does not call tools")
        if value not in ("system", "developer", "user", "assistant"):
            raise ValueError(f"unknown role {value!r}: use system, developer, user or assistant")
        return value

    @field_validator("content")
    @classmethod
    def _text_parts_only(
        cls, value: str | list[TextContentPart] | None
    ) -> str | list[TextContentPart] | None:
        if isinstance(value, list):
            for part in value:
                if part.type != "text" or part.text is None:
                    raise ValueError(f"content parts of type {part.type!r} are not supported (text only)")
        return value

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tool_calls are not supported: this server does not call tools")
        return value

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class ResponseFormat(_Request):
    type: str


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("logprobs are not supported")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("top_logprobs is not supported")
        return value

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tools and functions are not supported: this server does not call tools")
        return value

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none", "auto"):
            raise ValueError("tool choice is not supported: this server does not call tools")
        return value

    @field_validator("response_format")
    @classmethod
    def _text_format_only(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        if value is not None and value.type != "text":
            raise ValueError(f"response_format {value.type!r} is not supported (only 'text')")
        return value

    @field_validator("messages")
    @classmethod
    def _conversation(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if all(m.role in ("system", "developer") for m in value):
            raise ValueError("messages need at least one user or assistant message")
        if sum(len(m.text) for m in value) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the messages exceed {MAX_PROMPT_CHARACTERS} characters")
        return value

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def to_thread(self) -> tuple[str | None, list[ChatTurn]]:
        """The system prompt (the leading system/developer messages) and the turns after it."""
        system: list[str] = []
        turns: list[ChatTurn] = []
        for message in self.messages:
            role = "system" if message.role == "developer" else message.role
            if role == "system" and not turns:
                system.append(message.text)
            else:
                turns.append(ChatTurn(role=role, content=message.text))
        return ("\n\n".join(system) if system else None), turns


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # the OpenAI default for completions
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_text_prompt(cls, value: str | list[str] | list[int] | list[list[int]]) -> str | list[str]:
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("exactly one prompt is supported per request")
            if not isinstance(value[0], str):
                raise ValueError("token-id prompts are not supported: send text")
            value = value[0]
        if len(value) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the prompt exceeds {MAX_PROMPT_CHARACTERS} characters")
        if not value:
            raise ValueError("the prompt is empty")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("echo is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError("only best_of=1 is supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix (insertion) is not supported")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("logprobs are not supported")
        return value

    @property
    def prompt_text(self) -> str:
        assert isinstance(self.prompt, str)  # the validator made it one string
        return self.prompt


class EmbeddingRequest(_Request):
    model: str = Field(min_length=1, max_length=128)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _text_inputs(cls, value: str | list[str] | list[int] | list[list[int]]) -> str | list[str]:
        inputs = [value] if isinstance(value, str) else value
        texts = [i for i in inputs if isinstance(i, str)]
        if not inputs:
            raise ValueError("input is empty")
        if len(texts) != len(inputs):
            raise ValueError("token-id inputs are not supported: send text")
        if len(texts) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs per request")
        if any(not t for t in texts):
            raise ValueError("inputs must not be empty strings")
        if sum(len(t) for t in texts) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the inputs exceed {MAX_PROMPT_CHARACTERS} characters")
        return value if isinstance(value, str) else texts

    @field_validator("dimensions")
    @classmethod
    def _native_dimensions(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("dimensions is not supported: vectors have the model's native dimension")
        return value

    @property
    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else [i for i in self.input if isinstance(i, str)]


# ---------------------------------------------------------------- responses


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int | None, completion_tokens: int | None) -> UsageInfo:
        prompt, completion = prompt_tokens or 0, completion_tokens or 0
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatCompletionChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: OpenAIFinishReason
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int = 0
    delta: DeltaMessage
    finish_reason: OpenAIFinishReason | None = None
    logprobs: None = None


class ChatCompletionStreamResponse(BaseModel):
    """One chunk of a streamed chat completion (``object="chat.completion.chunk"``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: OpenAIFinishReason | None = None
    logprobs: None = None


class CompletionResponse(BaseModel):
    """A completion, and also one chunk of a streamed completion (the same object in OpenAI's API)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


CompletionStreamResponse = CompletionResponse


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # a base64 string with encoding_format="base64"


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: UsageInfo


class ModelCard(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "oasst"
    # Extensions: the model's context length (prompt plus answer, in tokens) and its kind.
    context_length: int
    max_input_length: int
    kind: str = "generation"
    worker_count: int = 0


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
