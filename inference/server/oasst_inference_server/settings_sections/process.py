"""Settings sections: the process, the database and the broker, event streams, tokens and the user cache."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class _TheProcessSettings(BaseModel):
    """Settings: the process."""

    environment: Literal["development", "production"] = Field(
        default="production",
        description="production (the default) refuses placeholder, short or empty secrets, the debug login "
        "and a wildcard CORS origin; development (make up, the tests) must be asked for (docs/security.md)",
    )
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port to listen on.")
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes sharing the port (uvicorn workers); more than one needs Redis and Postgres",
    )


class _DatabaseAndBrokerSettings(BaseModel):
    """Settings: database and broker."""

    database_url: str = Field(
        "sqlite+aiosqlite:///./.data/oasst-inference.db",
        description="SQLAlchemy URL: `sqlite+aiosqlite:///path` (embedded) or `postgresql+asyncpg://user:password@host:5432/db` (production).",
    )
    database_pool_size: int = Field(default=20, ge=1, description="Database connections per server process.")
    database_answer_connections: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Postgres connections per server process of their own for storing answers' ends: when thousands of answers end at once, they wait for these, not for the requests' pool.",
    )
    database_startup_timeout: float = Field(
        default=60.0, ge=0, description="Seconds to keep retrying while the database comes up"
    )
    # None or "memory://" runs the in-process broker (a single server process only).
    broker_url: str | None = None
    redis_key_prefix: str = Field(
        "oasst:",
        description="Prefix of every Redis key, so several deployments (or test runs) can share one Redis.",
    )
    redis_max_connections: int = Field(
        default=4096,
        ge=16,
        description="Redis connection pool size: every streaming reader and worker holds one while it waits",
    )


class _EventStreamsSettings(BaseModel):
    """Settings: event streams."""

    stream_ttl_seconds: float = Field(default=600.0, gt=0, description="Kept after a message ends")
    stream_maxlen: int = Field(
        default=20_000, ge=100, description="Most events kept in one message's stream."
    )
    stream_idle_ttl_seconds: float = Field(
        default=3600.0,
        gt=0,
        description=(
            "A stream that never gets its terminal event (its chat was deleted mid-answer) expires this "
            "long after its last event; keep it above the in-progress bound"
        ),
    )
    sse_ping_interval: float = Field(
        default=15.0,
        gt=0,
        description="Seconds of silence after which an event stream gets a keep-alive comment "
        "(`: keep-alive`, which clients ignore), so that a proxy's read timeout does not drop it.",
    )
    pending_update_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between queue-position updates to a reader whose message waits.",
    )


class _TokensAndTheUserCacheSettings(BaseModel):
    """Settings: tokens and the user cache."""

    auth_secret: str = Field(
        default="",
        description="Signs access and refresh tokens (32+ random characters; development has a default)",
    )
    access_token_expire_minutes: int = Field(
        default=60, ge=1, description="Lifetime of an access token (short-lived: clients refresh them)."
    )
    refresh_token_expire_days: int = Field(default=30, ge=1, description="Lifetime of a refresh token.")
    user_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        le=60,
        description="How long a server process trusts the user state (deleted, token generation, tier) "
        "it read for an access token before reading it again; a change made through another process "
        "or replica (deleting a user, revoking their tokens) reaches this one within it. 0: read it on "
        "every request",
    )
    user_cache_size: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Most users whose state one server process keeps."
    )
    allow_debug_auth: bool | None = Field(
        default=None,
        description="Password-less debug login (the text-client and the web page use it in development); "
        "default: on in development, off in production",
    )
