"""Usage limits of API keys and users: requests and tokens per minute, budgets, model allow-lists.

Revision ID: 0011_key_limits
Revises: 0010_answer_prefix
Create Date: 2026-12-08 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_key_limits"
down_revision: str | None = "0010_answer_prefix"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_limit",
        sa.Column("subject_kind", sa.String(length=8), nullable=False),
        sa.Column("subject_id", sa.String(length=36), nullable=False),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("budget_tokens", sa.BigInteger(), nullable=True),
        sa.Column("budget_usd", sa.Float(), nullable=True),
        sa.Column("budget_period", sa.String(length=8), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("subject_kind", "subject_id"),
    )


def downgrade() -> None:
    op.drop_table("usage_limit")
