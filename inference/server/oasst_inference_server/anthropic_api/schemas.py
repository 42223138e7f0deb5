"""The Anthropic Messages API on the wire: the subset of ``POST /v1/messages`` this server speaks.

Requests ignore unknown fields (clients such as Claude Code send many optional ones), accept what has no
effect on a local model (``cache_control``, ``metadata``, ``thinking``, ``service_tier``), and refuse with
a message naming the field what the models here cannot do (images, documents, server tools, a final
assistant message to continue): silently dropping it would answer a different question than the one
asked. docs/anthropic-api.md has the table. Every list and text is bounded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from oasst_inference_server.openai_protocol.request_base import MAX_PROMPT_CHARACTERS
from oasst_shared.limits import MAX_REQUEST_MESSAGES, MAX_STOP_SEQUENCE_LENGTH, MAX_STOP_SEQUENCES, MAX_TOP_K
from oasst_shared.tool_calls import MAX_TOOLS, check_function_name, check_schema_size

MAX_MAX_TOKENS = 1_000_000  # accepted; the answer is capped by the model's context
MAX_BLOCKS_PER_MESSAGE = 1_024
MAX_TOOL_DESCRIPTION = 8_192  # characters, as the OpenAI-compatible API's function descriptions
MAX_ID_LENGTH = 256  # a tool_use id

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "model_context_window_exceeded"]

# Block types of Anthropic's API that the models here cannot read, and why.
UNSUPPORTED_BLOCKS: dict[str, str] = {
    "image": "the models here read text only",
    "document": "the models here read text only (send the document's text as a text block)",
    "search_result": "search results are not supported (send their text as a text block)",
    "thinking": "the models here do not think in blocks (leave thinking blocks out of the history)",
    "redacted_thinking": "the models here do not think in blocks (leave them out of the history)",
    "server_tool_use": "server tools are not supported",
    "web_search_tool_result": "server tools are not supported",
    "container_upload": "containers are not supported",
}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


# ---------------------------------------------------------------- content blocks


class TextBlock(_Request):
    type: Literal["text"]
    text: str = Field(max_length=MAX_PROMPT_CHARACTERS)
    cache_control: dict[str, Any] | None = None  # accepted: nothing is cached between requests here


class ToolUseBlock(_Request):
    """A call the assistant made, in the history."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_function_name(value)


class ToolResultBlock(_Request):
    """The result of a call, in a user message."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    content: str | list[TextBlock] | None = Field(default=None)
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            if len(value) > MAX_BLOCKS_PER_MESSAGE:
                raise ValueError(f"at most {MAX_BLOCKS_PER_MESSAGE} content blocks per tool result")
            _refuse_unsupported(value)
        return value

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(block.text for block in self.content)
        return self.content or ""


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


def _refuse_unsupported(blocks: list[Any]) -> None:
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind in UNSUPPORTED_BLOCKS:
            raise ValueError(f"content[{index}]: {kind} blocks are not supported: {UNSUPPORTED_BLOCKS[kind]}")


class MessageParam(_Request):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _supported_blocks(cls, value: Any) -> Any:
        if isinstance(value, list):
            if len(value) > MAX_BLOCKS_PER_MESSAGE:
                raise ValueError(f"at most {MAX_BLOCKS_PER_MESSAGE} content blocks per message")
            _refuse_unsupported(value)
        return value

    @model_validator(mode="after")
    def _blocks_of_role(self) -> MessageParam:
        blocks = self.blocks
        if self.role == "assistant" and any(isinstance(b, ToolResultBlock) for b in blocks):
            raise ValueError("tool_result blocks belong in user messages")
        if self.role == "user" and any(isinstance(b, ToolUseBlock) for b in blocks):
            raise ValueError("tool_use blocks belong in assistant messages")
        return self

    @property
    def blocks(self) -> list[TextBlock | ToolUseBlock | ToolResultBlock]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)

    @property
    def characters(self) -> int:
        total = 0
        for block in self.blocks:
            if isinstance(block, TextBlock):
                total += len(block.text)
            elif isinstance(block, ToolResultBlock):
                total += len(block.text)
        return total


# ---------------------------------------------------------------- tools


class Tool(_Request):
    """A client tool: its name, what it does, and a JSON schema of its input."""

    type: str | None = None
    name: str
    description: str | None = Field(default=None, max_length=MAX_TOOL_DESCRIPTION)
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    cache_control: dict[str, Any] | None = None

    @field_validator("type")
    @classmethod
    def _client_tool(cls, value: str | None) -> str | None:
        if value not in (None, "custom"):
            raise ValueError(f"tools of type {value!r} (server tools) are not supported: define client tools")
        return value

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_function_name(value)

    @field_validator("input_schema")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_schema_size(value)


class ToolChoiceAuto(_Request):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None  # honoured: an answer makes at most one call


class ToolChoiceAny(_Request):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(_Request):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(_Request):
    type: Literal["none"]


ToolChoiceParam = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class Metadata(_Request):
    user_id: str | None = Field(default=None, max_length=256)


class JsonOutputFormat(_Request):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")

    @field_validator("schema_")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_schema_size(value)


class OutputConfig(_Request):
    """``format``: structured output, an answer matching a JSON schema; ``effort`` is accepted (the models
    here have no effort control)."""

    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


# ---------------------------------------------------------------- requests


class CountTokensRequest(_Request):
    """``POST /v1/messages/count_tokens``: what a prompt is made of."""

    model: str = Field(min_length=1, max_length=128)
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_REQUEST_MESSAGES)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceParam | None = None
    # Accepted: the models here do not think in blocks, so thinking changes nothing.
    thinking: dict[str, Any] | None = None
    # Refused when set: nothing here runs MCP servers or containers.
    mcp_servers: list[Any] | None = None
    container: Any = None

    @field_validator("system")
    @classmethod
    def _bounded_system(cls, value: str | list[TextBlock] | None) -> str | list[TextBlock] | None:
        if isinstance(value, list) and len(value) > MAX_BLOCKS_PER_MESSAGE:
            raise ValueError(f"at most {MAX_BLOCKS_PER_MESSAGE} system blocks")
        return value

    @field_validator("mcp_servers", "container")
    @classmethod
    def _not_here(cls, value: Any) -> Any:
        if value:
            raise ValueError("MCP servers and containers are not supported")
        return value

    @model_validator(mode="after")
    def _conversation(self) -> CountTokensRequest:
        if self.messages[-1].role != "user":
            raise ValueError(
                "messages: the last message must be a user message (continuing a final assistant "
                "message is not supported)"
            )
        total = len(self.system_text or "") + sum(m.characters for m in self.messages)
        if total > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"messages: the text exceeds {MAX_PROMPT_CHARACTERS} characters")
        called: set[str] = set()
        for index, message in enumerate(self.messages):
            for block in message.blocks:
                if isinstance(block, ToolUseBlock):
                    called.add(block.id)
                elif isinstance(block, ToolResultBlock) and block.tool_use_id not in called:
                    raise ValueError(
                        f"messages[{index}]: a tool_result answers {block.tool_use_id!r}, which no earlier "
                        "tool_use block made"
                    )
        choice = self.tool_choice
        names = {t.name for t in self.tools or []}
        if isinstance(choice, ToolChoiceTool) and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
        if isinstance(choice, ToolChoiceAny) and not names:
            raise ValueError("tool_choice 'any' needs tools")
        return self

    @property
    def system_text(self) -> str | None:
        if isinstance(self.system, list):
            return "\n\n".join(block.text for block in self.system) if self.system else None
        return self.system or None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1, le=MAX_MAX_TOKENS)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=MAX_TOP_K)
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    stream: bool = False
    service_tier: Literal["auto", "standard_only"] | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stop_sequences(cls, value: list[str] | None) -> list[str] | None:
        for stop in value or []:
            if not stop or len(stop) > MAX_STOP_SEQUENCE_LENGTH:
                raise ValueError(f"a stop sequence has 1 to {MAX_STOP_SEQUENCE_LENGTH} characters")
        return value


# ---------------------------------------------------------------- responses


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    # Prompt caching here is the backend's own (no cache_control): nothing is written on request; what its
    # prefix cache served is reported as read.
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageResponse(BaseModel):
    """An answer, ``{"type": "message", ...}``; also the skeleton a stream's ``message_start`` carries."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: Usage


class CountTokensResponse(BaseModel):
    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error shape, ``{"type": "error", "error": {"type", "message"}, "request_id"}``."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
    request_id: str | None = None
