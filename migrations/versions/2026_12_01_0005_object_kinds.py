"""Object kinds and the block format version: hybrid models' state and window objects.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Besides KV blocks the cold tier now keeps restore-point objects of hybrid and
sliding-window models: ``state`` snapshots (SSM / linear-attention layers) and
``window`` KV (sliding-attention layers). ``blocks.kind`` says which a row is (existing
rows are ``kv``); token-granular matching reads only ``kv`` children. Each namespace
records the block format version its files were written in (existing ones: 1), so
blocks of an older format are collected, never misread. The views show both.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def utc_text(seconds: str) -> str:
    if op.get_bind().dialect.name == "postgresql":
        return f"to_char(to_timestamp({seconds}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')"
    return f"datetime({seconds}, 'unixepoch')"


def cache_usage(with_kinds: bool) -> str:
    kinds = (
        """       n.format_version AS format_version,
       COALESCE(SUM(CASE WHEN b.kind = 'state' THEN 1 ELSE 0 END), 0) AS state_objects,
       COALESCE(SUM(CASE WHEN b.kind = 'state' THEN b.nbytes ELSE 0 END), 0) AS state_bytes,
       COALESCE(SUM(CASE WHEN b.kind = 'window' THEN 1 ELSE 0 END), 0) AS window_objects,
       COALESCE(SUM(CASE WHEN b.kind = 'window' THEN b.nbytes ELSE 0 END), 0) AS window_bytes,
"""
        if with_kinds
        else ""
    )
    tokens = (
        "CASE WHEN b.kind = 'kv' THEN b.token_count ELSE 0 END" if with_kinds else "b.token_count"
    )
    return f"""
CREATE VIEW cache_usage AS
SELECT n.digest AS namespace,
       n.model_name AS model_name,
       COUNT(b.key) AS blocks,
       COALESCE(SUM(b.nbytes), 0) AS nbytes,
       COALESCE(SUM({tokens}), 0) AS tokens,
{kinds}       MIN(b.last_access) AS oldest_access,
       MAX(b.last_access) AS newest_access,
       {utc_text("MIN(b.last_access)")} AS oldest_access_utc,
       {utc_text("MAX(b.last_access)")} AS newest_access_utc
FROM namespaces AS n
LEFT JOIN blocks AS b ON b.namespace = n.digest
GROUP BY n.digest
"""


def lru_blocks(with_kinds: bool) -> str:
    kind = "       b.kind AS kind,\n" if with_kinds else ""
    return f"""
CREATE VIEW lru_blocks AS
SELECT b.key AS key,
       b.namespace AS namespace,
       n.model_name AS model_name,
{kind}       b.token_count AS token_count,
       b.nbytes AS nbytes,
       b.hit_count AS hit_count,
       b.last_access AS last_access,
       {utc_text("b.last_access")} AS last_access_utc,
       b.relpath AS relpath
FROM blocks AS b
JOIN namespaces AS n ON n.digest = b.namespace
ORDER BY b.last_access, b.created_at, b.key
"""


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS lru_blocks")
    op.execute("DROP VIEW IF EXISTS cache_usage")


def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table("blocks") as batch:
        batch.add_column(sa.Column("kind", sa.String(8), nullable=False, server_default="kv"))
    with op.batch_alter_table("namespaces") as batch:
        batch.add_column(
            sa.Column("format_version", sa.Integer(), nullable=False, server_default="1")
        )
    op.execute(cache_usage(with_kinds=True))
    op.execute(lru_blocks(with_kinds=True))


def downgrade() -> None:
    _drop_views()
    # Older code reads every row as a KV block: forget the others (reconcile removes their files).
    op.execute("DELETE FROM blocks WHERE kind <> 'kv'")
    with op.batch_alter_table("blocks") as batch:
        batch.drop_column("kind")
    with op.batch_alter_table("namespaces") as batch:
        batch.drop_column("format_version")
    op.execute(cache_usage(with_kinds=False))
    op.execute(lru_blocks(with_kinds=False))
