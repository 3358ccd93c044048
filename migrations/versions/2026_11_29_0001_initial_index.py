"""Initial block index: namespaces, blocks, LRU indexes, the cache_usage and lru_blocks views.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

A later batch alteration of ``blocks`` or ``namespaces`` must drop and recreate the
views around it: SQLite views name the tables they read. The views' UTC columns are
spelled per dialect (SQLite ``datetime(x, 'unixepoch')``, PostgreSQL ``to_timestamp``),
with the same text: ``YYYY-MM-DD HH:MM:SS``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def utc_text(seconds: str) -> str:
    """SQL for epoch ``seconds`` as UTC text, in this connection's dialect."""
    if op.get_bind().dialect.name == "postgresql":
        return f"to_char(to_timestamp({seconds}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')"
    return f"datetime({seconds}, 'unixepoch')"


CACHE_USAGE = """
CREATE VIEW cache_usage AS
SELECT n.digest AS namespace,
       n.model_name AS model_name,
       n.model_path AS model_path,
       COUNT(b.key) AS blocks,
       COALESCE(SUM(b.nbytes), 0) AS nbytes,
       COALESCE(SUM(b.token_count), 0) AS tokens,
       MIN(b.last_access) AS oldest_access,
       MAX(b.last_access) AS newest_access,
       {oldest} AS oldest_access_utc,
       {newest} AS newest_access_utc
FROM namespaces AS n
LEFT JOIN blocks AS b ON b.namespace = n.digest
GROUP BY n.digest
"""

LRU_BLOCKS = """
CREATE VIEW lru_blocks AS
SELECT b.key AS key,
       b.namespace AS namespace,
       n.model_name AS model_name,
       b.token_count AS token_count,
       b.nbytes AS nbytes,
       b.hit_count AS hit_count,
       b.last_access AS last_access,
       {last} AS last_access_utc,
       b.relpath AS relpath
FROM blocks AS b
JOIN namespaces AS n ON n.digest = b.namespace
ORDER BY b.last_access, b.created_at, b.key
"""


def upgrade() -> None:
    op.create_table(
        "namespaces",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("model_name", sa.String(), nullable=False),
        sa.Column("model_path", sa.String(), nullable=False),
        sa.Column("block_size", sa.Integer(), nullable=False),
        sa.Column("kv_dtype", sa.String(), nullable=False),
        sa.Column("layer_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "blocks",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column(
            "namespace",
            sa.String(64),
            sa.ForeignKey("namespaces.digest", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("parent_key", sa.String(64), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("nbytes", sa.Integer(), nullable=False),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("relpath", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_access", sa.Float(), nullable=False),
        sa.Column("hit_count", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_index("ix_blocks_last_access", "blocks", ["last_access"])
    op.create_index("ix_blocks_namespace_last_access", "blocks", ["namespace", "last_access"])
    op.execute(
        CACHE_USAGE.format(
            oldest=utc_text("MIN(b.last_access)"), newest=utc_text("MAX(b.last_access)")
        )
    )
    op.execute(LRU_BLOCKS.format(last=utc_text("b.last_access")))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS lru_blocks")
    op.execute("DROP VIEW IF EXISTS cache_usage")
    op.drop_index("ix_blocks_namespace_last_access", table_name="blocks")
    op.drop_index("ix_blocks_last_access", table_name="blocks")
    op.drop_table("blocks")
    op.drop_table("namespaces")
