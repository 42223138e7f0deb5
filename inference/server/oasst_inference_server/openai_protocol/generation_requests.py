"""The requests of ``/v1/chat/completions`` and ``/v1/completions``: the subset of the OpenAI API this
service speaks.

Requests ignore unknown fields (SDKs and tools send many optional ones) but declare every field of
OpenAI's chat-completions request, and refuse, with a message naming the parameter, the options the
service cannot honour (``logit_bias``, audio, predicted outputs, web search, the deprecated
``functions``...): silently dropping them would answer a different question than the one asked.
docs/openai-api.md has the table. Requests convert themselves to
:class:`~oasst_shared.sampling.SamplingParameters` and to the conversation a worker renders
(``to_sampling_parameters``, ``to_thread``); what a worker must be able to do for a request
(its capabilities) is :meth:`_GenerationRequest.required_capabilities`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from oasst_inference_server.openai_protocol.request_base import MAX_PROMPT_CHARACTERS, ApiRequest
from oasst_shared.logprobs import MAX_TOP_LOGPROBS
from oasst_shared.protocol import ChatTurn
from oasst_shared.sampling import MAX_STOP_SEQUENCES, ResponseFormat, SamplingParameters
from oasst_shared.tool_calls import MAX_TOOLS, NamedToolChoice, ToolCall, ToolChoice, ToolDefinition

MAX_CHOICES = 8  # n: each choice is one job on the queue


class StreamOptions(ApiRequest):
    include_usage: bool = False


class _GenerationRequest(ApiRequest):
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
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=256)

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are supported")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported: token ids differ between the models served")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def choices(self) -> int:
        return self.n or 1

    def wants_logprobs(self) -> tuple[bool, int]:
        """Whether token logprobs are asked for, and how many alternatives per token."""
        return False, 0

    def output_format(self) -> ResponseFormat | None:
        return None

    def required_capabilities(self) -> dict[str, str]:
        """Beyond its sampling parameters' (``SamplingParameters.required_capabilities``): the worker
        capabilities this request needs, each with the parameter that needs it."""
        return {}

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
            frequency_penalty=self.frequency_penalty or None,
            presence_penalty=self.presence_penalty or None,
            response_format=self.output_format(),
            logprobs=self.wants_logprobs()[0] or None,
            top_logprobs=self.wants_logprobs()[1] or None,
        )


class TextContentPart(ApiRequest):
    type: str
    text: str | None = None


class ChatMessage(ApiRequest):
    role: str
    content: str | list[TextContentPart] | None = None
    # OpenAI's bound on the author's name (no white space, <, |, \\, / or >), and no control
    # characters; accepted, and not used.
    name: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=r"^[^\s<|\\/>\x00-\x1f\x7f]+$"
    )
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=256)

    @field_validator("role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value == "function":
            raise ValueError("role 'function' (deprecated) is not supported: use tools and role 'tool'")
        if value not in ("system", "developer", "user", "assistant", "tool"):
            raise ValueError(f"unknown role {value!r}: use system, developer, user, assistant or tool")
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

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages have tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        return self

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


# Fields of OpenAI's request that nothing here can honour, and why (any value but an empty one is refused).
REFUSED_CHAT_FIELDS: dict[str, str] = {
    "functions": "deprecated, use tools",
    "function_call": "deprecated, use tool_choice",
    "audio": "the models here answer with text only",
    "prediction": "predicted outputs are not implemented",
    "web_search_options": "this server does not search the web",
    "reasoning_effort": "no reasoning model is served here",
    "verbosity": "the models here have no verbosity control",
    "moderation": "this server runs no moderation model",
}


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # honoured: an answer makes at most one call
    response_format: ResponseFormat | None = None
    modalities: list[str] | None = None
    # Accepted, with no effect on the answer: bookkeeping and cache hints.
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    prompt_cache_retention: str | None = Field(default=None, max_length=32)
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = Field(default=None, max_length=256)
    # Refused (REFUSED_CHAT_FIELDS).
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    moderation: Any = None

    @field_validator(*REFUSED_CHAT_FIELDS)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in (None, False, {}, [], ""):
            raise ValueError(
                f"{info.field_name} is not supported: {REFUSED_CHAT_FIELDS[str(info.field_name)]}"
            )
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value and any(m != "text" for m in value):
            raise ValueError("modalities other than 'text' are not supported")
        return value

    @field_validator("store")
    @classmethod
    def _not_stored(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("store is not supported: the operator's settings decide what is kept")
        return value

    @field_validator("service_tier")
    @classmethod
    def _one_tier(cls, value: str | None) -> str | None:
        if value not in (None, "auto", "default"):
            raise ValueError("service_tier: only 'auto' and 'default' are offered")
        return value

    @field_validator("messages")
    @classmethod
    def _conversation(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if all(m.role in ("system", "developer") for m in value):
            raise ValueError("messages need at least one user or assistant message")
        if sum(len(m.text) for m in value) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the messages exceed {MAX_PROMPT_CHARACTERS} characters")
        called: set[str] = set()
        for message in value:
            called.update(call.id for call in message.tool_calls or [])
            if message.role == "tool" and message.tool_call_id not in called:
                raise ValueError(
                    f"a tool message answers the call {message.tool_call_id!r}, which no earlier "
                    "assistant message made"
                )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if choice.function.name not in names:
                raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among the tools")
        elif choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def wants_logprobs(self) -> tuple[bool, int]:
        return bool(self.logprobs), self.top_logprobs or 0

    def output_format(self) -> ResponseFormat | None:
        return self.response_format

    @property
    def calls_tools(self) -> bool:
        """Tools are offered or the conversation holds tool calls or results."""
        return bool(self.tools) or any(m.role == "tool" or m.tool_calls for m in self.messages)

    def required_capabilities(self) -> dict[str, str]:
        return {"tools": "tools"} if self.calls_tools else {}

    def to_thread(self) -> tuple[str | None, list[ChatTurn]]:
        """The system prompt (the leading system/developer messages) and the turns after it."""
        system: list[str] = []
        turns: list[ChatTurn] = []
        for message in self.messages:
            role = "system" if message.role == "developer" else message.role
            if role == "system" and not turns:
                system.append(message.text)
            else:
                turns.append(
                    ChatTurn(
                        role=role,
                        content=message.text,
                        tool_calls=message.tool_calls or None,
                        tool_call_id=message.tool_call_id,
                    )
                )
        return ("\n\n".join(system) if system else None), turns


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # the OpenAI default for completions
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    # An extension (vLLM has it too): structured output for raw completions.
    response_format: ResponseFormat | None = None

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

    def wants_logprobs(self) -> tuple[bool, int]:
        return self.logprobs is not None, self.logprobs or 0

    def output_format(self) -> ResponseFormat | None:
        return self.response_format

    @property
    def prompt_text(self) -> str:
        assert isinstance(self.prompt, str)  # the validator made it one string
        return self.prompt
