"""Index blocks by parent key: token-granular matching lists the children of a matched block.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

An index only: no table is rebuilt, so the views need not be recreated.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_blocks_parent_key", "blocks", ["parent_key"])


def downgrade() -> None:
    op.drop_index("ix_blocks_parent_key", table_name="blocks")
