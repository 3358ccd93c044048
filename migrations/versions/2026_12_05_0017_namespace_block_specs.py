"""Each namespace's block spec: what its object files hold, for checking them offline.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

A server records, when it first uses a namespace, the tensors (names, dtypes, shapes),
block size and vocabulary size its engine writes (``adapters.blockfiles.expected``), as
JSON. ``omlx admin cache verify`` checks every block file against it without loading
the model. Existing namespaces get "" (nothing to check against) until a server uses
them again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A plain ADD COLUMN (SQLite and PostgreSQL alike): the views over the table stay.
    op.add_column(
        "namespaces", sa.Column("block_spec", sa.Text(), nullable=False, server_default="")
    )


def downgrade() -> None:
    # SQLite 3.35+ drops a column in place when no view or index names it (none does).
    op.drop_column("namespaces", "block_spec")
