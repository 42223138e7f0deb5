"""Admin users: a user's ``is_admin`` flag, which lets their access token use the admin API.

Revision ID: 0012_admin_users
Revises: 0011_key_limits
Create Date: 2026-12-10 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_admin_users"
down_revision: str | None = "0011_key_limits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("user") as batch:
        # Nobody was an admin user before: the root token was the only way in.
        batch.add_column(sa.Column("is_admin", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("user") as batch:
        batch.drop_column("is_admin")
