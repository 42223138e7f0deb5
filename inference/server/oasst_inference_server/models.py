"""Database tables (SQLModel). Postgres or SQLite is the truth for users, chats and messages."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, Column, Index, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_id() -> str:
    return str(uuid.uuid4())


class DbUser(SQLModel, table=True):
    __tablename__ = "user"
    __table_args__ = (UniqueConstraint("provider", "provider_account_id", name="uq_user_provider_account"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    provider: str = Field(max_length=32)
    provider_account_id: str = Field(max_length=128)
    display_name: str = Field(max_length=256)
    created_at: datetime = Field(default_factory=utcnow)
    deleted: bool = False


class DbChat(SQLModel, table=True):
    __tablename__ = "chat"
    __table_args__ = (Index("ix_chat_user_created", "user_id", "created_at"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    user_id: str = Field(foreign_key="user.id", max_length=36)
    created_at: datetime = Field(default_factory=utcnow)
    modified_at: datetime = Field(default_factory=utcnow)
    title: str | None = Field(default=None, max_length=200)
    hidden: bool = False
    allow_data_use: bool = True
    active_thread_tail_message_id: str | None = Field(default=None, max_length=36)


class DbMessage(SQLModel, table=True):
    __tablename__ = "message"
    __table_args__ = (
        Index("ix_message_chat_created", "chat_id", "created_at"),
        Index("ix_message_state_model_enqueued", "state", "model_config_name", "enqueued_at"),
    )

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    # "chat" messages belong to a chat; "completion" and "embedding" requests of the OpenAI-compatible
    # API may not (see request_payload).
    kind: str = Field(default="chat", max_length=16)
    chat_id: str | None = Field(default=None, foreign_key="chat.id", max_length=36)
    user_id: str | None = Field(default=None, foreign_key="user.id", max_length=36, index=True)
    api_key_id: str | None = Field(default=None, max_length=36, index=True)
    parent_id: str | None = Field(default=None, foreign_key="message.id", max_length=36)
    role: str = Field(max_length=16)  # a oasst_shared.schemas.Role value
    content: str | None = None
    state: str = Field(max_length=32, index=True)  # a MessageState value
    error: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    # Generation bookkeeping (assistant messages only).
    model_config_name: str | None = Field(default=None, max_length=128)
    sampling_parameters: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    system_prompt: str | None = None
    enqueued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker_session_id: str | None = Field(default=None, max_length=64)
    lease_deadline: datetime | None = None
    attempts: int = 0
    cancel_requested: bool = False
    # For requests without a chat: the thread / raw prompt / embedding inputs to send the worker.
    request_payload: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # Results that are not text (embedding vectors).
    result_payload: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    finish_reason: str | None = Field(default=None, max_length=32)
    generated_tokens: int | None = None
    prompt_tokens: int | None = None
