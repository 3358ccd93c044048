"""Stored Responses-API responses (``store: true``), for previous_response_id and GET.

Revision ID: 0010
Revises: 0005
Create Date: 2026-12-01

A new table beside the block index: nothing existing is rebuilt, so the views stand.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("input_items", sa.Text(), nullable=False),
    )
    op.create_index("ix_responses_created_at", "responses", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_created_at", table_name="responses")
    op.drop_table("responses")
