"""Block heads: each KV block's tokens, so token-granular matching finds old siblings too.

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-01

Where the whole-block walk stops, the best continuation is a child of the last matched
key. Listing children by recency missed every older one once a parent had more than a
few (the chat template's first block has a child per conversation). With each block's
tokens stored big-endian (4 bytes a token, so byte order is token order), the children
sharing the longest run with the prompt are the neighbours of the prompt's own tokens in
``(parent_key, head)`` order: two index seeks, however many siblings there are. A table
of its own keeps ``blocks`` narrow for the budget's full scans; rows go with their block
(``ON DELETE CASCADE``). Blocks written before this revision have no head and are still
found by recency.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "block_heads",
        sa.Column(
            "key",
            sa.String(64),
            sa.ForeignKey("blocks.key", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("parent_key", sa.String(64), nullable=False),
        sa.Column("head", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_block_heads_parent_head", "block_heads", ["parent_key", "head"])


def downgrade() -> None:
    op.drop_index("ix_block_heads_parent_head", table_name="block_heads")
    op.drop_table("block_heads")
