"""Stored responses as links: ``previous_id`` and ``nbytes`` on ``responses``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01

A response that continued another now keeps only its own input items and the id of
the one it continued, so a conversation's storage grows linearly with its turns;
``nbytes`` lets the store keep inside ``responses_max_bytes``. Rows written before
keep their whole conversation: they read as chains of one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("responses") as batch:
        batch.add_column(sa.Column("previous_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("nbytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch.create_index("ix_responses_previous_id", ["previous_id"])
    op.execute("UPDATE responses SET nbytes = LENGTH(response) + LENGTH(input_items)")


def downgrade() -> None:
    with op.batch_alter_table("responses") as batch:
        batch.drop_index("ix_responses_previous_id")
        batch.drop_column("nbytes")
        batch.drop_column("previous_id")
