"""The core pipeline's tables: users, chats and messages.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "user",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("provider_account_id", sa.String(length=128), nullable=False),
        sa.Column("display_name", sa.String(length=256), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("provider", "provider_account_id", name="uq_user_provider_account"),
    )
    op.create_table(
        "chat",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=True),
        sa.Column("hidden", sa.Boolean(), nullable=False),
        sa.Column("allow_data_use", sa.Boolean(), nullable=False),
        sa.Column("active_thread_tail_message_id", sa.String(length=36), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["user.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_chat_user_created", "chat", ["user_id", "created_at"], unique=False)
    op.create_table(
        "message",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("chat_id", sa.String(length=36), nullable=True),
        sa.Column("user_id", sa.String(length=36), nullable=True),
        sa.Column("api_key_id", sa.String(length=36), nullable=True),
        sa.Column("parent_id", sa.String(length=36), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.String(), nullable=True),
        sa.Column("state", sa.String(length=32), nullable=False),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model_config_name", sa.String(length=128), nullable=True),
        sa.Column("sampling_parameters", sa.JSON(), nullable=True),
        sa.Column("system_prompt", sa.String(), nullable=True),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_session_id", sa.String(length=64), nullable=True),
        sa.Column("lease_deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("request_payload", sa.JSON(), nullable=True),
        sa.Column("result_payload", sa.JSON(), nullable=True),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("generated_tokens", sa.Integer(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["chat_id"], ["chat.id"]),
        sa.ForeignKeyConstraint(["parent_id"], ["message.id"]),
        sa.ForeignKeyConstraint(["user_id"], ["user.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_message_api_key_id", "message", ["api_key_id"], unique=False)
    op.create_index("ix_message_chat_created", "message", ["chat_id", "created_at"], unique=False)
    op.create_index("ix_message_state", "message", ["state"], unique=False)
    op.create_index(
        "ix_message_state_model_enqueued",
        "message",
        ["state", "model_config_name", "enqueued_at"],
        unique=False,
    )
    op.create_index("ix_message_user_id", "message", ["user_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_message_user_id", table_name="message")
    op.drop_index("ix_message_state_model_enqueued", table_name="message")
    op.drop_index("ix_message_state", table_name="message")
    op.drop_index("ix_message_chat_created", table_name="message")
    op.drop_index("ix_message_api_key_id", table_name="message")
    op.drop_table("message")
    op.drop_index("ix_chat_user_created", table_name="chat")
    op.drop_table("chat")
    op.drop_table("user")
