"""Database tables (SQLModel). Postgres or SQLite is the truth for users, chats and messages."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from sqlalchemy import JSON, BigInteger, Column, Dialect, Index, String, Text, TypeDecorator, UniqueConstraint
from sqlmodel import Field, SQLModel

from oasst_shared.schemas import MessageState, Role

E = TypeVar("E", bound=enum.Enum)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_id() -> str:
    return str(uuid.uuid4())


class StoredEnum(TypeDecorator[E], Generic[E]):
    """An enum kept as its value in a plain string column: the schema is the same as a string's, and the
    code reads and writes the enum (a string is accepted on the way in, e.g. from a test or a script)."""

    impl = String
    cache_ok = True

    def __init__(self, enum_type: type[E], length: int) -> None:
        super().__init__(length=length)
        self.enum_type = enum_type

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum_type(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum_type(value)


class MessageKind(str, enum.Enum):
    """What a message is, stored as its value (the same strings the column always held)."""

    chat = "chat"  # a turn of a chat (the chat API)
    completion = "completion"  # an OpenAI-compatible completion (or a Responses API one with store: false)
    embedding = "embedding"  # an OpenAI-compatible embedding request
    response = "response"  # a stored response of the Responses API
    response_deleted = "response_deleted"  # a deleted response: its content erased, its usage kept

    def __str__(self) -> str:  # in logs and f-strings the stored string, as before
        return self.value


class DbUser(SQLModel, table=True):
    __tablename__ = "user"
    __table_args__ = (UniqueConstraint("provider", "provider_account_id", name="uq_user_provider_account"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    provider: str = Field(max_length=32)
    provider_account_id: str = Field(max_length=128)
    display_name: str = Field(max_length=256)
    created_at: datetime = Field(default_factory=utcnow)
    deleted: bool = False
    deleted_at: datetime | None = None
    # Access tokens carry the generation they were issued in; revoking a user's tokens increments
    # it, so tokens already issued stop working at once (not only refresh tokens).
    token_generation: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # A key of settings.user_tiers (its weight in the fair queues); None: settings.default_user_tier.
    tier: str | None = Field(default=None, max_length=32)
    # May use the admin API with an access token (auth/admin_users.py); settings.admin_users also makes admins.
    is_admin: bool = False


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
    kind: MessageKind = Field(default=MessageKind.chat, sa_type=StoredEnum(MessageKind, 16))
    chat_id: str | None = Field(default=None, foreign_key="chat.id", max_length=36)
    user_id: str | None = Field(default=None, foreign_key="user.id", max_length=36, index=True)
    api_key_id: str | None = Field(default=None, max_length=36, index=True)
    parent_id: str | None = Field(default=None, foreign_key="message.id", max_length=36)
    role: Role = Field(sa_type=StoredEnum(Role, 16))
    content: str | None = None
    state: MessageState = Field(sa_type=StoredEnum(MessageState, 32), index=True)
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
    # The latest moment an in_progress may last, set at each claim (settings.in_progress_bound), pings
    # or not; past it the recovery loop retries or fails the message.
    generation_deadline: datetime | None = None
    # Times a backend refused this message for want of capacity; refunded up to max_backend_refusals.
    backend_refusals: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # Times a worker's backend died while it ran this message; at max_backend_deaths it fails (poison).
    backend_deaths: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    # While a message whose worker was lost waits for the next: the text streamed so far, which that
    # worker continues (docs/failure-semantics.md); the finished content starts with it.
    answer_prefix: str | None = None
    # Of prompt_tokens, those the worker's backend served from its prefix cache (where it tells).
    cached_tokens: int | None = None
    # For requests without a chat: the thread / raw prompt / embedding inputs to send the worker.
    request_payload: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # Results that are not text (embedding vectors).
    result_payload: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    finish_reason: str | None = Field(default=None, max_length=32)
    generated_tokens: int | None = None
    prompt_tokens: int | None = None
    # The owner's vote on an assistant message: -1, 0 or 1.
    score: int = 0
    # Fair-queue accounting (a scheduling.Ticket as JSON): who is charged, the estimate, the weight.
    scheduling: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))


# ---------------------------------------------------------------- auth, feedback and workers


class DbRefreshToken(SQLModel, table=True):
    """A refresh token, stored as a SHA-256 hash. Each refresh uses one up and issues its successor
    in the same family; presenting a used one again revokes the whole family."""

    __tablename__ = "refresh_token"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    user_id: str = Field(foreign_key="user.id", max_length=36, index=True)
    family_id: str = Field(max_length=36, index=True)
    token_hash: str = Field(max_length=64, unique=True)
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime
    used_at: datetime | None = None
    revoked_at: datetime | None = None


class DbReport(SQLModel, table=True):
    __tablename__ = "report"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    message_id: str = Field(foreign_key="message.id", max_length=36, index=True, ondelete="CASCADE")
    user_id: str = Field(foreign_key="user.id", max_length=36, index=True)
    report_type: str = Field(max_length=32)  # a oasst_shared.schemas.ReportType value
    reason: str = Field(default="", max_length=2000)
    created_at: datetime = Field(default_factory=utcnow)


class DbMessageEvaluation(SQLModel, table=True):
    """The user preferred ``selected_message_id`` over its siblings ``inferior_message_ids``."""

    __tablename__ = "message_evaluation"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    chat_id: str = Field(foreign_key="chat.id", max_length=36, index=True, ondelete="CASCADE")
    user_id: str = Field(foreign_key="user.id", max_length=36, index=True)
    selected_message_id: str = Field(foreign_key="message.id", max_length=36, ondelete="CASCADE")
    inferior_message_ids: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


class DbWorker(SQLModel, table=True):
    """A worker registered through the admin API; its API key is stored as a SHA-256 hash."""

    __tablename__ = "worker"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    name: str = Field(max_length=128)
    api_key_hash: str = Field(max_length=64, unique=True)
    api_key_prefix: str = Field(max_length=16)  # shown in listings so keys can be told apart
    created_at: datetime = Field(default_factory=utcnow)
    # What the key allows; None: any model config / settings.max_slots_per_worker / no socket limit.
    allowed_models: list[str] | None = Field(default=None, sa_column=Column(JSON))
    max_slots: int | None = None
    max_sockets: int | None = None
    # Trusted workers are never compliance-checked and compute the checks' expected answers.
    trusted: bool = Field(default=False)
    # Set when the worker failed settings.compliance_fail_threshold checks: it gets no user work.
    flagged_at: datetime | None = None
    flag_reason: str | None = Field(default=None, max_length=2000)
    # Failed checks before this do not count toward a new flag (set when an admin clears the flag).
    checks_cleared_at: datetime | None = None


class DbComplianceCheck(SQLModel, table=True):
    """One compliance check of an untrusted worker (or a usage claim the server's count refuted)."""

    __tablename__ = "compliance_check"
    __table_args__ = (Index("ix_compliance_check_worker_created", "worker_id", "created_at"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    # None for workers of a static key (settings.worker_api_keys): those are flagged per socket.
    worker_id: str | None = Field(default=None, foreign_key="worker.id", max_length=36, ondelete="CASCADE")
    session_id: str = Field(max_length=64, index=True)
    reference_session_id: str | None = Field(default=None, max_length=64)
    model_config_name: str = Field(max_length=128)
    kind: str = Field(max_length=16)  # "output" | "spot" | "usage"
    outcome: str = Field(max_length=16)  # "passed" | "failed" | "inconclusive"
    detail: str = Field(default="", max_length=2000)
    prompt: str | None = Field(default=None, sa_column=Column(Text))
    expected_text: str | None = Field(default=None, sa_column=Column(Text))
    actual_text: str | None = Field(default=None, sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow)


class DbWorkerEvent(SQLModel, table=True):
    """A worker socket connected or disconnected (audit trail, kept when the worker is deleted;
    live state is in the broker)."""

    __tablename__ = "worker_event"
    __table_args__ = (Index("ix_worker_event_worker_created", "worker_id", "created_at"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    # None for workers that authenticated with a key from settings.worker_api_keys.
    worker_id: str | None = Field(default=None, foreign_key="worker.id", max_length=36, ondelete="SET NULL")
    session_id: str = Field(max_length=64, index=True)
    event_type: str = Field(max_length=32)  # "connected" | "disconnected"
    model_config_name: str | None = Field(default=None, max_length=128)
    details: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow)


# ---------------------------------------------------------------- API keys


class DbApiKey(SQLModel, table=True):
    """A user's key for the OpenAI-compatible API, stored as a SHA-256 hash (the key is shown once).

    Revoking sets ``revoked_at`` and keeps the row, so usage stays attributed to the key.
    """

    __tablename__ = "api_key"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    user_id: str = Field(foreign_key="user.id", max_length=36, index=True)
    name: str = Field(max_length=100)
    prefix: str = Field(max_length=16)  # the key's first characters, shown in listings
    key_hash: str = Field(max_length=64, unique=True)
    created_at: datetime = Field(default_factory=utcnow)
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


# ---------------------------------------------------------------- per-user settings


class DbUserSettings(SQLModel, table=True):
    """A user's client settings (``oasst_shared.schemas.UserSettings`` as JSON), one row per user."""

    __tablename__ = "user_settings"

    user_id: str = Field(foreign_key="user.id", primary_key=True, max_length=36, ondelete="CASCADE")
    settings: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    updated_at: datetime = Field(default_factory=utcnow)


# ---------------------------------------------------------------- usage that outlives its chat


class DbUsageRecord(SQLModel, table=True):
    """A generation whose message was deleted (with its chat or account): what rate limits and usage
    still count, so deleting a chat or an account never resets them.

    ``subject`` is a hash of the sign-in identity (provider and provider account), so a person who
    deletes their account and signs in again as a new user still meets the old counts.
    """

    __tablename__ = "usage_record"
    __table_args__ = (
        Index("ix_usage_record_user_enqueued", "user_id", "enqueued_at"),
        Index("ix_usage_record_subject_enqueued", "subject", "enqueued_at"),
    )

    message_id: str = Field(primary_key=True, max_length=36)  # one record per generation
    user_id: str = Field(foreign_key="user.id", max_length=36)
    subject: str = Field(max_length=64)
    api_key_id: str | None = Field(default=None, max_length=36)
    kind: str = Field(default="chat", max_length=16)
    model_config_name: str | None = Field(default=None, max_length=128)
    enqueued_at: datetime
    prompt_tokens: int = 0
    generated_tokens: int = 0
    recorded_at: datetime = Field(default_factory=utcnow)


# ---------------------------------------------------------------- usage limits of keys and users


class DbUsageLimit(SQLModel, table=True):
    """The limits an admin set on an API key (``subject_kind`` "key") or a user ("user"):
    ``oasst_shared.usage_limits.UsageLimits``; the counters they are checked against live in the broker."""

    __tablename__ = "usage_limit"

    subject_kind: str = Field(primary_key=True, max_length=8)
    subject_id: str = Field(primary_key=True, max_length=36)
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    budget_tokens: int | None = Field(default=None, sa_type=BigInteger)
    budget_usd: float | None = None
    budget_period: str | None = Field(default=None, max_length=8)
    allowed_models: list[str] | None = Field(default=None, sa_column=Column(JSON))
    updated_at: datetime = Field(default_factory=utcnow)


# ---------------------------------------------------------------- model aliases


class DbModelAlias(SQLModel, table=True):
    """An alias the operator set through the admin API or CLI: a stable name for one model config, with
    the fallbacks that serve when it cannot (``oasst_shared.model_routes``). Replaces an alias of the same
    name that a model-config file declares."""

    __tablename__ = "model_alias"

    alias: str = Field(primary_key=True, max_length=64)
    model_config_name: str = Field(max_length=128)
    fallbacks: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    updated_at: datetime = Field(default_factory=utcnow)


# ---------------------------------------------------------------- moderation


class DbModerationFlag(SQLModel, table=True):
    """A text the moderation hook flagged (a prompt or an answer), with what it did: the admins' list.

    No foreign keys: a flag is an audit record of what was seen, kept while its message or chat lives
    on or not (an account's deletion deletes its flags, :mod:`..chats.accounts`)."""

    __tablename__ = "moderation_flag"
    __table_args__ = (Index("ix_moderation_flag_created", "created_at"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    message_id: str | None = Field(default=None, max_length=36, index=True)  # None: a refused request
    chat_id: str | None = Field(default=None, max_length=36)
    user_id: str = Field(max_length=36, index=True)
    stage: str = Field(max_length=16)  # "request" | "answer"
    check: str = Field(max_length=32)  # "word_list" | "classifier"
    action: str = Field(max_length=16)  # "flag" | "refuse" | "replace"
    categories: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    excerpt: str = Field(default="", max_length=500)
    created_at: datetime = Field(default_factory=utcnow)
