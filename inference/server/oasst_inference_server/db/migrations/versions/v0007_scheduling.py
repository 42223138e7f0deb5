"""Scheduling: a user's tier, and each message's fair-queue ticket.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("user") as batch:
        batch.add_column(sa.Column("tier", sa.String(length=32), nullable=True))
    with op.batch_alter_table("message") as batch:
        batch.add_column(sa.Column("scheduling", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("message") as batch:
        batch.drop_column("scheduling")
    with op.batch_alter_table("user") as batch:
        batch.drop_column("tier")
