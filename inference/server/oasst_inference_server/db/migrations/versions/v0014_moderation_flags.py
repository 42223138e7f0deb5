"""Moderation: the texts the moderation hook flagged, for the admins' list.

Revision ID: 0014_moderation_flags
Revises: 0013_model_aliases
Create Date: 2026-12-20 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_moderation_flags"
down_revision: str | None = "0013_model_aliases"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "moderation_flag",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("message_id", sa.String(length=36), nullable=True),
        sa.Column("chat_id", sa.String(length=36), nullable=True),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("check", sa.String(length=32), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("categories", sa.JSON(), nullable=False),
        sa.Column("excerpt", sa.String(length=500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_moderation_flag_created", "moderation_flag", ["created_at"], unique=False)
    op.create_index("ix_moderation_flag_message_id", "moderation_flag", ["message_id"], unique=False)
    op.create_index("ix_moderation_flag_user_id", "moderation_flag", ["user_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_moderation_flag_user_id", table_name="moderation_flag")
    op.drop_index("ix_moderation_flag_message_id", table_name="moderation_flag")
    op.drop_index("ix_moderation_flag_created", table_name="moderation_flag")
    op.drop_table("moderation_flag")
