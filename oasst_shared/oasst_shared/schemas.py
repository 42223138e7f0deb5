"""REST and server-sent-event schemas of the inference server's chat API.

Field names and shapes follow the original Open-Assistant inference server, so its text-client,
load-test script and web frontend work against this server unchanged.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from oasst_shared.model_configs import ParameterConfig
from oasst_shared.sampling import SamplingParameters

MAX_MESSAGE_LENGTH = 32_000


class MessageState(str, enum.Enum):
    manual = "manual"  # a prompter message, written by a person
    pending = "pending"
    in_progress = "in_progress"
    complete = "complete"
    aborted_by_worker = "aborted_by_worker"
    cancelled = "cancelled"
    timeout = "timeout"
    failed = "failed"

    @property
    def is_terminal(self) -> bool:
        return self not in (MessageState.pending, MessageState.in_progress)


class Role(str, enum.Enum):
    prompter = "prompter"
    assistant = "assistant"


class _Request(BaseModel):
    # Unknown fields are ignored so that clients of the original server (which send e.g. ``plugins``)
    # keep working; everything we do read is validated.
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateChatRequest(_Request):
    title: str | None = Field(default=None, max_length=200)


class CreatePrompterMessageRequest(_Request):
    parent_id: str | None = None
    content: str = Field(min_length=1, max_length=MAX_MESSAGE_LENGTH)


class CreateAssistantMessageRequest(_Request):
    parent_id: str
    model_config_name: str = Field(min_length=1, max_length=128)
    sampling_parameters: SamplingParameters = Field(default_factory=SamplingParameters)
    system_prompt: str | None = Field(default=None, max_length=MAX_MESSAGE_LENGTH)


class MessageRead(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: str
    chat_id: str | None  # None for requests of the OpenAI-compatible API that are not stored as chats
    parent_id: str | None
    content: str | None
    created_at: datetime
    role: Role
    state: MessageState
    score: int = 0
    reports: list[str] = Field(default_factory=list)
    model_config_name: str | None = None
    sampling_parameters: SamplingParameters | None = None
    error: str | None = None
    finish_reason: str | None = None
    generated_tokens: int | None = None
    prompt_tokens: int | None = None
    attempts: int = 0
    work_parameters: dict[str, object] | None = None


class ChatListRead(BaseModel):
    id: str
    created_at: datetime
    modified_at: datetime
    title: str | None = None
    hidden: bool = False
    allow_data_use: bool = True
    active_thread_tail_message_id: str | None = None


class ChatRead(ChatListRead):
    messages: list[MessageRead] = Field(default_factory=list)


class ListChatsResponse(BaseModel):
    chats: list[ChatListRead]
    next: str | None = None
    prev: str | None = None


class ModelConfigInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    name: str
    model_id: str
    description: str = ""
    max_input_length: int
    max_total_length: int
    kind: str = "generation"
    parameter_configs: list[ParameterConfig] = Field(default_factory=list)
    worker_count: int = 0


class TokenPair(BaseModel):
    access_token: str
    token_type: Literal["bearer"] = "bearer"


class LoginResponse(BaseModel):
    access_token: TokenPair
    refresh_token: TokenPair | None = None


class ErrorBody(BaseModel):
    """Every error response of the REST API: a human message and a stable machine code."""

    detail: str
    code: str
    errors: list[dict[str, object]] | None = None


# ---------------------------------------------------------------- server-sent events


class PendingEvent(BaseModel):
    event_type: Literal["pending"] = "pending"
    queue_position: int
    queue_size: int


class TokenEvent(BaseModel):
    event_type: Literal["token"] = "token"
    text: str


class RetryEvent(BaseModel):
    """The worker that was generating this message was lost: discard the partial text received."""

    event_type: Literal["retry"] = "retry"
    attempt: int
    reason: str


class MessageEvent(BaseModel):
    event_type: Literal["message"] = "message"
    message: MessageRead


class ErrorEvent(BaseModel):
    event_type: Literal["error"] = "error"
    error: str
    message: MessageRead | None = None


StreamEvent = Annotated[
    PendingEvent | TokenEvent | RetryEvent | MessageEvent | ErrorEvent, Field(discriminator="event_type")
]
TERMINAL_EVENT_TYPES = frozenset({"message", "error"})
