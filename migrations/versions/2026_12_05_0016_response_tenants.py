"""Stored responses by tenant: ``tenant`` on ``responses``.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05

A tenant's key reads, continues and deletes only its own tenant's responses. Rows
written before are the default tenant's ("" : the ``--api-key`` or key-less one).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("responses") as batch:
        batch.add_column(sa.Column("tenant", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("responses") as batch:
        batch.drop_column("tenant")
