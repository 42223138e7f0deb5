"""The Responses API's request, as much of OpenAI's as this server honours, with a bound on every field.

Unknown fields are ignored (SDKs send many optional ones); the options nothing here can honour
(built-in tools, conversations, prompt templates, reasoning) are refused with a message naming them.
A request converts itself to a chat-completions request (:meth:`ResponsesRequest.to_chat_messages`
and friends), so the ``/v1`` checks, sampling and prompt building apply unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from oasst_inference_server.openai_protocol.request_base import MAX_PROMPT_CHARACTERS
from oasst_shared.tool_calls import MAX_TOOLS

MAX_INPUT_ITEMS = 256  # items of one request's input
MAX_ITEM_ID = 64  # characters of an item's id or a response id
MAX_CALL_ID = 256  # characters of a function call's call_id
MAX_CONTENT_PARTS = 64  # content parts of one input message
MAX_METADATA_KEYS = 16  # OpenAI's bound: 16 pairs, keys of 64 characters, values of 512
RESPONSE_ID_PREFIX = "resp_"
_ID_PATTERN = r"^[A-Za-z0-9_-]+$"

# Fields of OpenAI's request that nothing here can honour, and why (any value but an empty one is refused).
REFUSED_RESPONSE_FIELDS: dict[str, str] = {
    "conversation": "conversations are not implemented: use previous_response_id",
    "prompt": "prompt templates are not implemented: send the input",
    "reasoning": "no reasoning model is served here",
}


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class ContentPart(_Wire):
    """A text part of an input message (``input_text``; ``output_text`` in an assistant's message)."""

    type: Literal["input_text", "output_text", "text"]
    text: str = Field(max_length=MAX_PROMPT_CHARACTERS)


def _bounded_text(value: str | list[ContentPart], what: str) -> str | list[ContentPart]:
    """A text given whole or in parts: at most ``MAX_CONTENT_PARTS`` parts, or ``MAX_PROMPT_CHARACTERS``."""
    if isinstance(value, list) and len(value) > MAX_CONTENT_PARTS:
        raise ValueError(f"{what} has at most {MAX_CONTENT_PARTS} content parts")
    if isinstance(value, str) and len(value) > MAX_PROMPT_CHARACTERS:
        raise ValueError(f"{what} has at most {MAX_PROMPT_CHARACTERS} characters")
    return value


def _joined(value: str | list[ContentPart]) -> str:
    return value if isinstance(value, str) else "".join(part.text for part in value)


class MessageItem(_Wire):
    type: Literal["message"] = "message"
    id: str | None = Field(default=None, max_length=MAX_ITEM_ID, pattern=_ID_PATTERN)
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    status: str | None = Field(default=None, max_length=32)

    @field_validator("content")
    @classmethod
    def _bounded_content(cls, value: str | list[ContentPart]) -> str | list[ContentPart]:
        return _bounded_text(value, "a message")

    @property
    def text(self) -> str:
        return _joined(self.content)


class FunctionCallItem(_Wire):
    type: Literal["function_call"]
    id: str | None = Field(default=None, max_length=MAX_ITEM_ID, pattern=_ID_PATTERN)
    call_id: str = Field(min_length=1, max_length=MAX_CALL_ID)
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=MAX_PROMPT_CHARACTERS)
    status: str | None = Field(default=None, max_length=32)


class FunctionCallOutputItem(_Wire):
    type: Literal["function_call_output"]
    id: str | None = Field(default=None, max_length=MAX_ITEM_ID, pattern=_ID_PATTERN)
    call_id: str = Field(min_length=1, max_length=MAX_CALL_ID)
    output: str | list[ContentPart]
    status: str | None = Field(default=None, max_length=32)

    @field_validator("output")
    @classmethod
    def _bounded_output(cls, value: str | list[ContentPart]) -> str | list[ContentPart]:
        return _bounded_text(value, "a function call's output")

    @property
    def text(self) -> str:
        return _joined(self.output)


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]
_ITEM_TYPES = ("message", "function_call", "function_call_output")


class FunctionTool(_Wire):
    """A function the model may call (the Responses API's flat shape)."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = Field(default=None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(_Wire):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)


class TextFormat(_Wire):
    """``text.format``: free text, any JSON object, or JSON matching a named schema."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = Field(default=None, max_length=64)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = Field(default=None, max_length=8192)
    strict: bool | None = None

    def to_response_format(self) -> dict[str, Any] | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        schema = {"name": self.name or "response", "schema": self.schema_, "strict": self.strict}
        if self.description is not None:
            schema["description"] = self.description
        return {"type": "json_schema", "json_schema": schema}


class TextOptions(_Wire):
    format: TextFormat | None = None
    verbosity: str | None = Field(default=None, max_length=16)


class ResponsesRequest(_Wire):
    model: str = Field(min_length=1, max_length=128)
    input: str | list[InputItem]
    instructions: str | None = Field(default=None, max_length=MAX_PROMPT_CHARACTERS)
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None  # honoured: an answer makes at most one call
    text: TextOptions | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = Field(default=None, max_length=MAX_ITEM_ID + len(RESPONSE_ID_PREFIX))
    metadata: dict[str, str] | None = Field(default=None, max_length=MAX_METADATA_KEYS)
    user: str | None = Field(default=None, max_length=256)
    safety_identifier: str | None = Field(default=None, max_length=256)
    prompt_cache_key: str | None = Field(default=None, max_length=256)
    service_tier: str | None = Field(default=None, max_length=32)
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = Field(default=None, max_length=16)
    # Refused (REFUSED_RESPONSE_FIELDS).
    conversation: Any = None
    prompt: Any = None
    reasoning: Any = None

    @model_validator(mode="before")
    @classmethod
    def _typed_items(cls, data: Any) -> Any:
        """Items with a role and no type are messages (OpenAI's "easy input messages"); an unknown
        type is named in the error."""
        if isinstance(data, dict) and isinstance(data.get("input"), list):
            items = []
            for index, item in enumerate(data["input"]):
                if isinstance(item, dict):
                    kind = item.get("type", "message" if "role" in item else None)
                    if kind not in _ITEM_TYPES:
                        raise ValueError(
                            f"input[{index}]: items of type {kind!r} are not supported "
                            "(message, function_call, function_call_output)"
                        )
                    item = {**item, "type": kind}
                items.append(item)
            data = {**data, "input": items}
        return data

    @field_validator(*REFUSED_RESPONSE_FIELDS)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        if value not in (None, False, {}, [], "") and not (
            info.field_name == "reasoning" and _no_effort(value)
        ):
            raise ValueError(
                f"{info.field_name} is not supported: {REFUSED_RESPONSE_FIELDS[str(info.field_name)]}"
            )
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        for index, tool in enumerate(value or []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise ValueError(f"tools[{index}]: tools of type {kind!r} are not supported (function only)")
        return value

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, text in (value or {}).items():
            if len(key) > 64 or len(text) > 512:
                raise ValueError("metadata keys have at most 64 characters, values at most 512")
        return value

    @field_validator("input")
    @classmethod
    def _bounded_input(cls, value: str | list[InputItem]) -> str | list[InputItem]:
        if isinstance(value, list):
            if not value:
                raise ValueError("the input has no items")
            if len(value) > MAX_INPUT_ITEMS:
                raise ValueError(f"the input has {len(value)} items; this server accepts {MAX_INPUT_ITEMS}")
        elif not value:
            raise ValueError("the input is empty")
        elif len(value) > MAX_PROMPT_CHARACTERS:
            raise ValueError(f"the input exceeds {MAX_PROMPT_CHARACTERS} characters")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        if self.background and not self.store:
            raise ValueError("background responses must be stored: background needs store true")
        return self

    @property
    def items(self) -> list[InputItem]:
        """The input as items (a text input is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def tool_definitions(self) -> list[dict[str, Any]] | None:
        """The tools in the chat API's shape."""
        if not self.tools:
            return None
        return [
            {
                "type": "function",
                "function": {
                    k: v
                    for k, v in {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                        "strict": tool.strict,
                    }.items()
                    if v is not None
                },
            }
            for tool in self.tools
        ]

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        if isinstance(self.tool_choice, NamedFunctionChoice):
            return {"type": "function", "function": {"name": self.tool_choice.name}}
        return self.tool_choice

    def response_format(self) -> dict[str, Any] | None:
        fmt = self.text.format if self.text is not None else None
        return fmt.to_response_format() if fmt is not None else None


def _no_effort(value: Any) -> bool:
    """``reasoning`` that asks for nothing (SDKs send ``{}`` or ``{"effort": null}``)."""
    return isinstance(value, dict) and not any(v not in (None, "none") for v in value.values())


def chat_messages_of(items: list[InputItem]) -> list[dict[str, Any]]:
    """The input items as chat-completions messages: a function call joins the assistant message
    before it (or starts one), its output is a ``tool`` message."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return messages
