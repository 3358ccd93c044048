"""SQLAlchemy 2.x declarative models of the block index (DESIGN §4 Index).

The schema itself is owned by the Alembic migrations in ``migrations/``; these models
mirror it for queries and ``alembic revision --autogenerate``. Times are epoch seconds.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class NamespaceRow(Base):
    """One model identity (config, weights, tokenizer, dtype, block size), the same on every host."""

    __tablename__ = "namespaces"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    model_name: Mapped[str] = mapped_column(String, nullable=False)
    block_size: Mapped[int] = mapped_column(Integer, nullable=False)
    kv_dtype: Mapped[str] = mapped_column(String, nullable=False)
    layer_count: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    last_used_at: Mapped[float] = mapped_column(Float, nullable=False)
    # The block format its files were written in: older ones are collected, never read.
    format_version: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    # What its object files hold (``adapters.blockfiles.expected``, JSON); "" when unknown.
    block_spec: Mapped[str] = mapped_column(Text, nullable=False, server_default="")


class NamespaceHostRow(Base):
    """Where one host keeps a namespace's model: paths are facts about one filesystem."""

    __tablename__ = "namespace_hosts"

    namespace: Mapped[str] = mapped_column(
        String(64), ForeignKey("namespaces.digest", ondelete="CASCADE"), primary_key=True
    )
    host: Mapped[str] = mapped_column(String, primary_key=True)
    model_path: Mapped[str] = mapped_column(String, nullable=False)
    last_used_at: Mapped[float] = mapped_column(Float, nullable=False)


class BlockRow(Base):
    """A block whose file is complete and fsynced (a row never exists without its file)."""

    __tablename__ = "blocks"
    __table_args__ = (
        Index("ix_blocks_last_access", "last_access"),
        Index("ix_blocks_namespace_last_access", "namespace", "last_access"),
        # Children, newest first (token-granular matching): read off the index, not sorted.
        Index("ix_blocks_parent_key_last_access", "parent_key", "last_access"),
    )

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    namespace: Mapped[str] = mapped_column(
        String(64), ForeignKey("namespaces.digest", ondelete="CASCADE"), nullable=False
    )
    parent_key: Mapped[str] = mapped_column(String(64), nullable=False)
    token_count: Mapped[int] = mapped_column(Integer, nullable=False)
    nbytes: Mapped[int] = mapped_column(Integer, nullable=False)
    checksum: Mapped[str] = mapped_column(String(64), nullable=False)
    relpath: Mapped[str] = mapped_column(String, nullable=False)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    last_access: Mapped[float] = mapped_column(Float, nullable=False)
    hit_count: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    # kv: a block's KV; state / window: a restore point's snapshot or window KV; external:
    # a library caller's block; image: a VLM's image rows (domain.keys)
    kind: Mapped[str] = mapped_column(String(8), nullable=False, server_default="kv")
    # The server_id of the server that computed it (NULL: written before 0019, or imported).
    computed_by: Mapped[str | None] = mapped_column(String, nullable=True)


class BlockHeadRow(Base):
    """A KV block's tokens (big-endian uint32s), for finding the children nearest a prompt."""

    __tablename__ = "block_heads"
    __table_args__ = (Index("ix_block_heads_parent_head", "parent_key", "head"),)

    key: Mapped[str] = mapped_column(
        String(64), ForeignKey("blocks.key", ondelete="CASCADE"), primary_key=True
    )
    parent_key: Mapped[str] = mapped_column(String(64), nullable=False)
    head: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class ImageRowsRow(Base):
    """An image rows object's image, tenant and shape (its block row has the rest: file,
    bytes, recency); the ``image_rows`` view joins the two for people."""

    __tablename__ = "images"
    __table_args__ = (Index("ix_images_digest", "digest"),)

    key: Mapped[str] = mapped_column(
        String(64), ForeignKey("blocks.key", ondelete="CASCADE"), primary_key=True
    )
    digest: Mapped[str] = mapped_column(String(64), nullable=False)
    tenant: Mapped[str] = mapped_column(String(64), nullable=False, server_default="")
    row_count: Mapped[int] = mapped_column(Integer, nullable=False)
    hidden_size: Mapped[int] = mapped_column(Integer, nullable=False)
    dtype: Mapped[str] = mapped_column(String(8), nullable=False)


class WeightDigestRow(Base):
    """A model file's weight digest on one host, valid while its size and mtime are unchanged."""

    __tablename__ = "weight_digests"
    __table_args__ = (PrimaryKeyConstraint("host", "path", name="pk_weight_digests"),)

    host: Mapped[str] = mapped_column(String, nullable=False)
    path: Mapped[str] = mapped_column(String, nullable=False)
    size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    mtime: Mapped[float] = mapped_column(Float, nullable=False)
    digest: Mapped[str] = mapped_column(String(64), nullable=False)
    computed_at: Mapped[float] = mapped_column(Float, nullable=False)


class ResponseRow(Base):
    """A stored Responses-API response: its object and its resolved input items, as JSON text.

    Text rather than a JSON column: the store never queries inside them, and the same
    bytes work on SQLite and PostgreSQL.
    """

    __tablename__ = "responses"
    __table_args__ = (
        Index("ix_responses_created_at", "created_at"),
        Index("ix_responses_previous_id", "previous_id"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float, nullable=False)
    response: Mapped[str] = mapped_column(Text, nullable=False)
    # This turn's own input items; earlier turns are the rows previous_id leads to.
    input_items: Mapped[str] = mapped_column(Text, nullable=False)
    previous_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    nbytes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # The API key's tenant that created it: another tenant's key cannot read or continue it.
    tenant: Mapped[str] = mapped_column(String(64), nullable=False, server_default="")
