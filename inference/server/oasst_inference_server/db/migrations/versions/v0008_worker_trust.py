"""Worker trust: a worker key's `trusted` flag and compliance flag, and the compliance checks.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        # Keys that existed before trust was a notion stay untrusted, like new ones.
        batch.add_column(sa.Column("trusted", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("flagged_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("flag_reason", sa.String(length=2000), nullable=True))
        batch.add_column(sa.Column("checks_cleared_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "compliance_check",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("worker_id", sa.String(length=36), nullable=True),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("reference_session_id", sa.String(length=64), nullable=True),
        sa.Column("model_config_name", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.String(length=2000), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("expected_text", sa.Text(), nullable=True),
        sa.Column("actual_text", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["worker_id"], ["worker.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_compliance_check_session_id", "compliance_check", ["session_id"], unique=False)
    op.create_index(
        "ix_compliance_check_worker_created", "compliance_check", ["worker_id", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_compliance_check_worker_created", table_name="compliance_check")
    op.drop_index("ix_compliance_check_session_id", table_name="compliance_check")
    op.drop_table("compliance_check")
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("checks_cleared_at")
        batch.drop_column("flag_reason")
        batch.drop_column("flagged_at")
        batch.drop_column("trusted")
