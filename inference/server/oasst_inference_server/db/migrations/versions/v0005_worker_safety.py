"""Worker safety: what a worker key allows, the in-progress time bound and refunded backend refusals.

Revision ID: 0005_worker_safety
Revises: 0004
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_worker_safety"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        batch.add_column(sa.Column("allowed_models", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("max_slots", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_sockets", sa.Integer(), nullable=True))
    with op.batch_alter_table("message") as batch:
        batch.add_column(sa.Column("generation_deadline", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("backend_refusals", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("message") as batch:
        batch.drop_column("backend_refusals")
        batch.drop_column("generation_deadline")
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("max_sockets")
        batch.drop_column("max_slots")
        batch.drop_column("allowed_models")
