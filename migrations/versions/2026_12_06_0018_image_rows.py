"""Image rows: a vision-language model's encoder output per image, kept beside the blocks.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

Each image a VLM encoded is a ``blocks`` row of kind ``image`` (its file, bytes,
checksum, recency: the same budget, LRU eviction and reconcile as every block) and an
``images`` row saying which image (its pixels' SHA-256), whose (the API key's tenant,
"" for the default one) and what shape (``row_count`` x ``hidden_size`` in ``dtype``: a row per placeholder
token); it goes with
its block (``ON DELETE CASCADE``). The ``image_rows`` view joins them with the model's
name and readable times; ``cache_usage`` counts image objects and bytes as it counts
state, window and external ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def utc_text(seconds: str) -> str:
    if op.get_bind().dialect.name == "postgresql":
        return f"to_char(to_timestamp({seconds}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')"
    return f"datetime({seconds}, 'unixepoch')"


def _count(kind: str) -> str:
    return (
        f"       COALESCE(SUM(CASE WHEN b.kind = '{kind}' THEN 1 ELSE 0 END), 0) AS {kind}_objects,\n"
        f"       COALESCE(SUM(CASE WHEN b.kind = '{kind}' THEN b.nbytes ELSE 0 END), 0) AS {kind}_bytes,\n"
    )


def cache_usage(with_images: bool) -> str:
    kinds = (
        ("state", "window", "external", "image") if with_images else ("state", "window", "external")
    )
    return f"""
CREATE VIEW cache_usage AS
SELECT n.digest AS namespace,
       n.model_name AS model_name,
       COUNT(b.key) AS blocks,
       COALESCE(SUM(b.nbytes), 0) AS nbytes,
       COALESCE(SUM(CASE WHEN b.kind IN ('kv', 'external') THEN b.token_count ELSE 0 END), 0) AS tokens,
       n.format_version AS format_version,
{"".join(_count(k) for k in kinds)}       MIN(b.last_access) AS oldest_access,
       MAX(b.last_access) AS newest_access,
       {utc_text("MIN(b.last_access)")} AS oldest_access_utc,
       {utc_text("MAX(b.last_access)")} AS newest_access_utc
FROM namespaces AS n
LEFT JOIN blocks AS b ON b.namespace = n.digest
GROUP BY n.digest
"""


def image_rows() -> str:
    return f"""
CREATE VIEW image_rows AS
SELECT n.model_name AS model_name,
       i.digest AS digest,
       i.tenant AS tenant,
       i.row_count AS row_count,
       i.hidden_size AS hidden_size,
       i.dtype AS dtype,
       b.nbytes AS nbytes,
       b.hit_count AS hit_count,
       b.created_at AS created_at,
       b.last_access AS last_access,
       {utc_text("b.created_at")} AS created_utc,
       {utc_text("b.last_access")} AS last_used_utc,
       b.key AS key,
       b.namespace AS namespace,
       b.relpath AS relpath
FROM images AS i
JOIN blocks AS b ON b.key = i.key
JOIN namespaces AS n ON n.digest = b.namespace
"""


def upgrade() -> None:
    op.create_table(
        "images",
        sa.Column(
            "key",
            sa.String(64),
            sa.ForeignKey("blocks.key", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False, server_default=""),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("hidden_size", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
    )
    op.create_index("ix_images_digest", "images", ["digest"])
    op.execute("DROP VIEW IF EXISTS cache_usage")
    op.execute(cache_usage(with_images=True))
    op.execute(image_rows())


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS image_rows")
    op.execute("DROP VIEW IF EXISTS cache_usage")
    # Older code verifies every row by its tokens: forget the image ones (reconcile
    # removes their files).
    op.execute("DELETE FROM blocks WHERE kind = 'image'")
    op.drop_index("ix_images_digest", table_name="images")
    op.drop_table("images")
    op.execute(cache_usage(with_images=False))
