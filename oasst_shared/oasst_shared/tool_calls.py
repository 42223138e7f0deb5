"""Tool (function) definitions, tool choices and tool calls, in the shapes of the OpenAI chat API.

The worker turns a request's tools and tool choice into what its backend understands: backends with
native tool support get them passed through; on the others the tools are rendered into the prompt and
the answer is constrained with :func:`tool_call_schema`, a JSON schema whose every instance is a call
of one of the allowed tools with arguments valid for that tool's parameters. :func:`parse_tool_call`
reads such an answer back.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_TOOLS = 128  # OpenAI's limit
MAX_SCHEMA_CHARACTERS = 64_000  # a JSON schema (parameters, response format), serialised
# Matched against the whole name (fullmatch): with re.match, "$" would also take a name ending in "\n".
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_schema_size(schema: dict[str, Any]) -> dict[str, Any]:
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARACTERS:
        raise ValueError(f"the JSON schema exceeds {MAX_SCHEMA_CHARACTERS} characters")
    return schema


def check_function_name(value: str) -> str:
    if not _FUNCTION_NAME.fullmatch(value):
        raise ValueError("a function name has 1 to 64 characters among a-z, A-Z, 0-9, _ and -")
    return value


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="1 to 64 letters, digits, `_` or `-`.")
    description: str | None = Field(
        default=None, max_length=8192, description="What the function does, for the model."
    )
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="A JSON schema of its arguments.",
    )
    strict: bool | None = Field(
        None,
        description="Accepted as OpenAI has it; forced calls always match the parameters where enforced.",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_function_name(value)

    @field_validator("parameters")
    @classmethod
    def _bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_schema_size(value)


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = Field("function", description="Always `function`.")
    function: FunctionDefinition = Field(description="The function the model may call.")


class NamedFunction(BaseModel):
    name: str = Field(description="Its name.")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return check_function_name(value)


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": ...}}``: this tool must be called."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = Field("function", description="Always `function`.")
    function: NamedFunction = Field(description="The function that must be called.")


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolCallFunction(BaseModel):
    name: str = Field(description="The function's name.")
    arguments: str = Field(description="Its arguments as JSON text, as in OpenAI's API.")


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(
        max_length=256,
        description="The call's id; the `tool` turn with its result names it in `tool_call_id`.",
    )
    type: Literal["function"] = Field("function", description="Always `function`.")
    function: ToolCallFunction = Field(description="The function called and its arguments.")


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def called_tools(tools: list[ToolDefinition], choice: ToolChoice | None) -> list[ToolDefinition]:
    """The tools an answer may call under ``choice`` (none for "none")."""
    if choice == "none":
        return []
    if isinstance(choice, NamedToolChoice):
        return [t for t in tools if t.function.name == choice.function.name]
    return list(tools)


def tool_call_schema(tools: list[ToolDefinition]) -> dict[str, Any]:
    """A JSON schema matching exactly the calls ``{"name": ..., "arguments": {...}}`` of ``tools``."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                "arguments": tool.function.parameters,
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


_TAGGED = re.compile(r"^\s*<tool_call>\s*(.*?)\s*(</tool_call>\s*)?$", re.DOTALL)


def parse_tool_call(text: str, tools: list[ToolDefinition]) -> ToolCall | None:
    """The call in an answer ``{"name": ..., "arguments": {...}}`` (optionally inside
    ``<tool_call>`` tags) of one of ``tools``; None if the answer is not such a call."""
    tagged = _TAGGED.match(text)
    body = tagged.group(1) if tagged else text.strip()
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict) or call["name"] not in {t.function.name for t in tools}:
        return None
    return ToolCall(
        id=new_tool_call_id(),
        function=ToolCallFunction(name=call["name"], arguments=json.dumps(arguments, ensure_ascii=False)),
    )


def looks_like_tool_call(text: str) -> bool | None:
    """For an answer's beginning: True if it may be a tool call, False if it cannot, None if too short."""
    head = text.lstrip()
    if not head:
        return None
    if head.startswith("{"):
        return True
    tag = "<tool_call>"
    if len(head) < len(tag):
        return True if tag.startswith(head) else False
    return head.startswith(tag)
