"""Domain values of the block cache: namespaces, block metadata, index rows."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """One model identity whose blocks are interchangeable (DESIGN §4)."""

    digest: str
    model_name: str
    model_path: str
    block_size: int
    kv_dtype: str
    layer_count: int


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """What the engine knows of a full block when it is cut from a cache."""

    key: str
    parent_key: str  # the namespace digest for the first block of a prompt
    namespace: str
    token_count: int


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """An index row: a block whose file is complete and fsynced."""

    key: str
    namespace: str
    parent_key: str
    token_count: int
    nbytes: int
    checksum: str  # hex SHA-256 of the whole file
    relpath: str  # relative to the cache folder, '/'-separated
    created_at: float
    last_access: float
    hit_count: int = 0


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    """One row of the ``cache_usage`` view."""

    namespace: str
    model_name: str
    blocks: int
    nbytes: int
    tokens: int
    oldest_access: float | None
    newest_access: float | None


@dataclass(frozen=True, slots=True)
class DecodedBlock:
    """A block file's content as the codec reads it back."""

    tokens: tuple[int, ...]
    payload: object
    metadata: dict[str, str]
