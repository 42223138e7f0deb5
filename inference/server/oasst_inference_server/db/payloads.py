"""The JSON a message keeps of its request and of its result (``DbMessage.request_payload`` and
``result_payload``), as models: written through them and read back through them.

They write the JSON these columns always held, so rows stored before them read as they did. A read that
acts on a request (its work frame) validates it and refuses the message when it does not read
(``RequestPayload.model_validate``); a read that only shows or estimates uses :func:`read_request` and
:func:`read_result`, which give None (and log why) instead.
"""

from __future__ import annotations

from typing import Any

from loguru import logger
from pydantic import BaseModel, ConfigDict, ValidationError, field_serializer

from oasst_inference_server.db.stored_json import read_stored
from oasst_shared.protocol import ChatTurn
from oasst_shared.tool_calls import ToolCall, ToolChoice, ToolDefinition

# The request's parts a fair-queue estimate counts, by their stored key.
ESTIMATED_PARTS = ("thread", "raw_prompt", "inputs")


class RequestPayload(BaseModel):
    """What a message without a chat sends its worker (a chat's turns live in the chat), and what the
    Responses API keeps of its request. Written with only the keys that were given."""

    model_config = ConfigDict(extra="ignore")

    thread: list[ChatTurn] | None = None  # a chat completion's conversation
    raw_prompt: str | None = None  # a completion's prompt
    inputs: list[str] | None = None  # an embedding request's texts
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    # The Responses API's StoredRequest (responses_api.objects), read by that package.
    response: dict[str, Any] | None = None

    @field_serializer("thread", "tools")
    def _without_nulls(
        self, parts: list[ChatTurn] | list[ToolDefinition] | None
    ) -> list[dict[str, Any]] | None:
        return None if parts is None else [p.model_dump(mode="json", exclude_none=True) for p in parts]

    def stored(self) -> dict[str, Any]:
        """The column's value: the keys given (each whole), as JSON."""
        return self.model_dump(mode="json", include=self.model_fields_set)

    def estimated_characters(self) -> int:
        """The characters a fair-queue estimate counts: the stored text of the conversation, prompt and
        inputs."""
        stored = self.stored()
        return sum(len(str(stored.get(key) or "")) for key in ESTIMATED_PARTS)


class ResultPayload(BaseModel):
    """A result that is not text: the answer's tool calls, or an embedding request's vectors."""

    model_config = ConfigDict(extra="ignore")

    tool_calls: list[ToolCall] | None = None
    embeddings: list[list[float]] | None = None

    def stored(self) -> dict[str, Any]:
        """The column's value: the keys given (each whole), as JSON."""
        return self.model_dump(mode="json", include=self.model_fields_set)


def read_request(value: Any, *, what: str) -> RequestPayload | None:
    """A stored request read back, or None (logged) if there is none or it no longer reads."""
    return read_stored(RequestPayload, value, what=f"{what}: request_payload")


def read_result(value: Any, *, what: str) -> ResultPayload | None:
    """A stored result read back, or None (logged) if there is none or it no longer reads."""
    return read_stored(ResultPayload, value, what=f"{what}: result_payload")


def read_embeddings(value: Any) -> list[list[float]] | None:
    """The vectors of an embedding request's stored result, or None if it holds none that read. Read
    without :func:`read_result`'s depth walk: a result of thousands of vectors is three levels deep."""
    try:
        return ResultPayload.model_validate(value).embeddings if value is not None else None
    except ValidationError as exc:
        logger.warning("stored embeddings no longer read ({})", exc.errors(include_url=False)[0]["msg"])
        return None
