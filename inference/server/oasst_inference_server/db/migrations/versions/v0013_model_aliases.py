"""Model aliases set at runtime: a stable name for a model config, with its fallbacks.

Revision ID: 0013_model_aliases
Revises: 0012_admin_users
Create Date: 2026-12-10 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_model_aliases"
down_revision: str | None = "0012_admin_users"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_alias",
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("model_config_name", sa.String(length=128), nullable=False),
        sa.Column("fallbacks", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("alias"),
    )


def downgrade() -> None:
    op.drop_table("model_alias")
