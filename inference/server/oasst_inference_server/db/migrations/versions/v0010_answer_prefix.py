"""Continuation: the text a lost worker streamed, which the next worker continues; and the prompt
tokens a backend's prefix cache served.

Revision ID: 0010_answer_prefix
Revises: 0009_backend_deaths
Create Date: 2026-12-07 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_answer_prefix"
down_revision: str | None = "0009_backend_deaths"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("message") as batch:
        batch.add_column(sa.Column("answer_prefix", sa.String(), nullable=True))
        batch.add_column(sa.Column("cached_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("message") as batch:
        batch.drop_column("cached_tokens")
        batch.drop_column("answer_prefix")
