"""Who computed each block: a nullable ``computed_by`` column on ``blocks``.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07

Servers sharing one index and one cold tier record their ``server_id`` with each block they
compute, so a restore can say whose work it used (``x-omlx-cache: ... computed_by=``, the
``origin`` label of ``omlx_cache_hit_tokens``). Rows written before this revision, and
imported blocks, hold NULL: not known.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN of a nullable column (SQLite and PostgreSQL alike): no table copy,
    # existing rows read as NULL, and the views over the table stay.
    op.add_column("blocks", sa.Column("computed_by", sa.String(), nullable=True))


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place when no view or index names it (none does).
    op.drop_column("blocks", "computed_by")
