"""External blocks: the library API's caller-keyed blocks counted in ``cache_usage``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

``omlx.cache`` saves blocks under hashes its callers chose: rows of kind ``external``
(no new column: ``blocks.kind`` has been there since 0005). Each covers ``token_count``
positions, so the view's ``tokens`` counts them as it counts KV blocks, and says how
many objects and bytes they are, as it does for state and window objects.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
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


def cache_usage(with_external: bool) -> str:
    kinds = ("state", "window", "external") if with_external else ("state", "window")
    counted = "('kv', 'external')" if with_external else "('kv')"
    return f"""
CREATE VIEW cache_usage AS
SELECT n.digest AS namespace,
       n.model_name AS model_name,
       COUNT(b.key) AS blocks,
       COALESCE(SUM(b.nbytes), 0) AS nbytes,
       COALESCE(SUM(CASE WHEN b.kind IN {counted} THEN b.token_count ELSE 0 END), 0) AS tokens,
       n.format_version AS format_version,
{"".join(_count(k) for k in kinds)}       MIN(b.last_access) AS oldest_access,
       MAX(b.last_access) AS newest_access,
       {utc_text("MIN(b.last_access)")} AS oldest_access_utc,
       {utc_text("MAX(b.last_access)")} AS newest_access_utc
FROM namespaces AS n
LEFT JOIN blocks AS b ON b.namespace = n.digest
GROUP BY n.digest
"""


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS cache_usage")
    op.execute(cache_usage(with_external=True))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS cache_usage")
    # Older code verifies every row by its tokens: forget the external ones (reconcile
    # removes their files).
    op.execute("DELETE FROM blocks WHERE kind = 'external'")
    op.execute(cache_usage(with_external=False))
