"""Remember weight digests per (path, size, mtime): hashing a large model is slow.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "weight_digests",
        sa.Column("path", sa.String(), primary_key=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("mtime", sa.Float(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("computed_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("weight_digests")
