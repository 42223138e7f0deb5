"""Settings sections: the edge, what production serves, users and auth, the admin API, chat limits."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from oasst_shared.limits import MAX_MESSAGE_LENGTH, MAX_REQUEST_MESSAGES


class _TheEdgeSettings(BaseModel):
    """Settings: the edge."""

    cors_origins: list[str] = Field(
        default_factory=list, description="Browser origins allowed to call the API (credentials included)"
    )
    max_request_body_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1024,
        description="Largest request body, checked from Content-Length and while it streams in (413)",
    )
    request_body_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a request body may take to arrive whole (then 408 and the connection closes)",
    )
    request_header_timeout: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a connection may take to send a whole request line and headers, from when it "
        "opens or from the first byte of its next request (then 408 and it closes)",
    )
    max_request_header_bytes: int = Field(
        default=32 * 1024,
        ge=4096,
        description="Largest request line plus headers (then 431 and the connection closes)",
    )
    max_connections: int = Field(
        default=16_384,
        ge=1,
        description="Open connections per server process (HTTP, event streams and worker sockets); past it "
        "a new connection is answered 503 and closed, the open ones are untouched. Lowered at start to "
        "what the process's open-file limit allows",
    )


class _WhatProductionServesSettings(BaseModel):
    """Settings: what production serves."""

    docs_enabled: bool | None = Field(
        default=None,
        description="Serve /docs, /redoc and /openapi.json; default: on in development, off in production",
    )
    metrics_enabled: bool | None = Field(
        default=None, description="Serve /metrics; default: on in development, off in production"
    )
    metrics_token: str | None = Field(
        default=None, description="When set, /metrics asks for Authorization: Bearer <token> (32+ characters)"
    )


class _UsersAndAuthSettings(BaseModel):
    """Settings: users and auth."""

    # Web frontends that sign their users in with the ``TrustedClient`` header (the original
    # Open-Assistant inference server's format); each key authorises one frontend.
    trusted_client_api_keys: list[str] = Field(
        default_factory=list,
        description="NAME:KEY per frontend: the key speaks only for users that frontend created, and only "
        "with client NAME in its TrustedClient header (a bare KEY is the frontend named website)",
    )
    # Public base URL of this server, used to build OAuth callback URLs (``{api_root}/auth/callback/github``).
    api_root: str = "http://127.0.0.1:8000"
    oauth_state_ttl_seconds: int = Field(
        default=600,
        ge=30,
        description="Seconds an OAuth login may take between the redirect to the provider and the callback.",
    )
    auth_github_client_id: str | None = Field(
        None, description="GitHub OAuth app client id; unset disables GitHub login."
    )
    auth_github_client_secret: str | None = Field(None, description="GitHub OAuth app client secret.")
    auth_github_authorize_url: str = Field(
        "https://github.com/login/oauth/authorize",
        description="GitHub's authorisation page (changed only for tests).",
    )
    auth_github_token_url: str = Field(
        "https://github.com/login/oauth/access_token",
        description="GitHub's token endpoint (changed only for tests).",
    )
    auth_github_api_base_url: str = Field(
        "https://api.github.com/", description="GitHub's API (changed only for tests)."
    )
    auth_discord_client_id: str | None = Field(
        None, description="Discord OAuth app client id; unset disables Discord login."
    )
    auth_discord_client_secret: str | None = Field(None, description="Discord OAuth app client secret.")
    auth_discord_authorize_url: str = Field(
        "https://discord.com/api/oauth2/authorize",
        description="Discord's authorisation page (changed only for tests).",
    )
    auth_discord_token_url: str = Field(
        "https://discord.com/api/oauth2/token",
        description="Discord's token endpoint (changed only for tests).",
    )
    auth_discord_api_base_url: str = Field(
        "https://discord.com/api/", description="Discord's API (changed only for tests)."
    )


class _AdminApiSettings(BaseModel):
    """Settings: admin API."""

    # ``Authorization: Bearer <root token>`` on /admin/...; None disables the admin API.
    admin_root_token: str | None = None
    admin_users: list[Annotated[str, Field(pattern=r"^[a-z]{1,32}:\S{1,128}$")]] = Field(
        default_factory=list,
        max_length=1000,
        description="PROVIDER:ACCOUNT_ID sign-in identities (e.g. github:1234567) that are admin users, besides "
        "the users flagged with PUT /admin/users/{id}/admin: their access tokens may use the admin API",
    )


class _ChatLimitsSettings(BaseModel):
    """Settings: chat limits."""

    max_messages_per_chat: int = Field(default=500, ge=2, description="Messages one chat may hold.")
    max_message_length: int = Field(
        default=16_000, ge=1, le=MAX_MESSAGE_LENGTH, description="Characters per prompter message"
    )
    max_system_prompt_length: int = Field(
        default=8_000,
        ge=1,
        le=MAX_MESSAGE_LENGTH,
        description="Characters of a system prompt (chat API and /v1)",
    )
    max_messages_per_request: int = Field(
        default=256, ge=1, le=MAX_REQUEST_MESSAGES, description="Messages of one /v1/chat/completions request"
    )
    max_chats_per_user: int = Field(
        default=1_000, ge=1, description="Chats a user may keep (hidden ones count; deleting frees room)"
    )
    max_api_keys_per_user: int = Field(default=50, ge=1, description="Unrevoked API keys per user (409)")
    max_sse_readers_per_user: int = Field(
        default=32, ge=1, description="Event streams one user may hold open at once, across replicas (429)"
    )
    max_sse_readers_per_message: int = Field(
        default=8, ge=1, description="Event streams open at once on one message, across replicas (429)"
    )
    openai_stream_resume_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Seconds a /v1 stream whose client left keeps generating, so that a reconnect with "
        "Last-Event-ID can resume it; then it is cancelled (0: at once)",
    )
    max_queue_size: int = Field(
        default=200, ge=1, description="Pending messages per model before new ones get a 503"
    )
