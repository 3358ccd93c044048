"""Children by recency: ``blocks (parent_key, last_access)`` replaces ``(parent_key)``.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03

A lookup asks the index for a block's most recently used children. With an index on
``parent_key`` alone every child was read and sorted: 71 ms per lookup for a namespace
root with 31k children (the first blocks of 31k conversations; bench/index_scale.py at
1M rows), paid by every new prompt. In ``(parent_key, last_access)`` order the newest
few are read straight off the index (0.1-0.5 ms), and it still serves lookups by
``parent_key`` alone, so the old index goes.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_blocks_parent_key_last_access", "blocks", ["parent_key", "last_access"])
    op.drop_index("ix_blocks_parent_key", table_name="blocks")


def downgrade() -> None:
    op.create_index("ix_blocks_parent_key", "blocks", ["parent_key"])
    op.drop_index("ix_blocks_parent_key_last_access", table_name="blocks")
