"""Per-host rows for a shared index: model paths and weight digests are keyed by host.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Several servers may share one index (PostgreSQL). A model's path, and the digest of
the file at that path, are facts about one host's filesystem: another host may hold
other weights at the same path. ``namespaces.model_path`` moves to ``namespace_hosts``
(one row per namespace and host) and ``weight_digests`` gains ``host`` in its key.
Rows that exist already belong to the host that runs this upgrade: a SQLite index is
only ever opened on its own host. The views read ``namespaces``, so they are dropped
and made again around its rebuild.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def utc_text(seconds: str) -> str:
    if op.get_bind().dialect.name == "postgresql":
        return f"to_char(to_timestamp({seconds}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')"
    return f"datetime({seconds}, 'unixepoch')"


def cache_usage(with_model_path: bool) -> str:
    path = "       n.model_path AS model_path,\n" if with_model_path else ""
    return f"""
CREATE VIEW cache_usage AS
SELECT n.digest AS namespace,
       n.model_name AS model_name,
{path}       COUNT(b.key) AS blocks,
       COALESCE(SUM(b.nbytes), 0) AS nbytes,
       COALESCE(SUM(b.token_count), 0) AS tokens,
       MIN(b.last_access) AS oldest_access,
       MAX(b.last_access) AS newest_access,
       {utc_text("MIN(b.last_access)")} AS oldest_access_utc,
       {utc_text("MAX(b.last_access)")} AS newest_access_utc
FROM namespaces AS n
LEFT JOIN blocks AS b ON b.namespace = n.digest
GROUP BY n.digest
"""


def lru_blocks() -> str:
    return f"""
CREATE VIEW lru_blocks AS
SELECT b.key AS key,
       b.namespace AS namespace,
       n.model_name AS model_name,
       b.token_count AS token_count,
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
    host = socket.gethostname()
    op.create_table(
        "namespace_hosts",
        sa.Column(
            "namespace",
            sa.String(64),
            sa.ForeignKey("namespaces.digest", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("host", sa.String(), primary_key=True),
        sa.Column("model_path", sa.String(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=False),
    )
    op.execute(
        sa.text(
            "INSERT INTO namespace_hosts (namespace, host, model_path, last_used_at) "
            "SELECT digest, :host, model_path, last_used_at FROM namespaces"
        ).bindparams(host=host)
    )
    _drop_views()
    with op.batch_alter_table("namespaces") as batch:
        batch.drop_column("model_path")
    op.execute(cache_usage(with_model_path=False))
    op.execute(lru_blocks())

    op.rename_table("weight_digests", "weight_digests_0003")
    op.create_table(
        "weight_digests",
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("mtime", sa.Float(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("computed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("host", "path", name="pk_weight_digests"),
    )
    op.execute(
        sa.text(
            "INSERT INTO weight_digests (host, path, size, mtime, digest, computed_at) "
            "SELECT :host, path, size, mtime, digest, computed_at FROM weight_digests_0003"
        ).bindparams(host=host)
    )
    op.drop_table("weight_digests_0003")


def downgrade() -> None:
    host = socket.gethostname()
    op.rename_table("weight_digests", "weight_digests_0004")
    op.create_table(
        "weight_digests",
        sa.Column("path", sa.String(), primary_key=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("mtime", sa.Float(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("computed_at", sa.Float(), nullable=False),
    )
    op.execute(
        sa.text(
            "INSERT INTO weight_digests (path, size, mtime, digest, computed_at) "
            "SELECT path, size, mtime, digest, computed_at FROM weight_digests_0004 "
            "WHERE host = :host"
        ).bindparams(host=host)
    )
    op.drop_table("weight_digests_0004")

    _drop_views()
    with op.batch_alter_table("namespaces") as batch:
        batch.add_column(sa.Column("model_path", sa.String(), nullable=False, server_default=""))
    op.execute(
        sa.text(
            "UPDATE namespaces SET model_path = COALESCE((SELECT h.model_path FROM "
            "namespace_hosts AS h WHERE h.namespace = namespaces.digest "
            "ORDER BY h.host = :host DESC, h.last_used_at DESC LIMIT 1), '')"
        ).bindparams(host=host)
    )
    op.drop_table("namespace_hosts")
    op.execute(cache_usage(with_model_path=True))
    op.execute(lru_blocks())
