"""The API edge: per-user token generation, usage records that outlive deleted
chats and accounts, and trusted-client users moved to their own provider namespace.

Revision ID: 0006
Revises: 0005_worker_safety
Create Date: 2026-12-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005_worker_safety"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Providers of the sign-in methods; every other provider value was a trusted client's name.
_LOGIN_PROVIDERS = ("debug", "github", "discord", "deleted")


def upgrade() -> None:
    with op.batch_alter_table("user") as batch:
        batch.add_column(sa.Column("token_generation", sa.Integer(), server_default="0", nullable=False))
    op.create_table(
        "usage_record",
        sa.Column("message_id", sa.String(length=36), nullable=False),
        sa.Column("user_id", sa.String(length=36), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("api_key_id", sa.String(length=36), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model_config_name", sa.String(length=128), nullable=True),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("generated_tokens", sa.Integer(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["user.id"]),
        sa.PrimaryKeyConstraint("message_id"),
    )
    op.create_index("ix_usage_record_user_enqueued", "usage_record", ["user_id", "enqueued_at"])
    op.create_index("ix_usage_record_subject_enqueued", "usage_record", ["subject", "enqueued_at"])
    # Trusted-client users get the provider "trusted:<client>", apart from the sign-in methods'.
    user = sa.table("user", sa.column("provider", sa.String))
    op.execute(
        user.update()
        .where(
            user.c.provider.not_in(_LOGIN_PROVIDERS),
            ~user.c.provider.startswith("trusted:"),
            sa.func.length(user.c.provider) <= 24,  # the column holds 32 characters
        )
        .values(provider="trusted:" + user.c.provider)
    )


def downgrade() -> None:
    user = sa.table("user", sa.column("provider", sa.String))
    op.execute(
        user.update()
        .where(user.c.provider.startswith("trusted:"))
        .values(provider=sa.func.substr(user.c.provider, 9))
    )
    op.drop_index("ix_usage_record_subject_enqueued", table_name="usage_record")
    op.drop_index("ix_usage_record_user_enqueued", table_name="usage_record")
    op.drop_table("usage_record")
    with op.batch_alter_table("user") as batch:
        batch.drop_column("token_generation")
