"""Block files in an S3-compatible object store, with read-through copies on the local SSD."""

from __future__ import annotations

from pathlib import Path

from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.objectstore.errors import ObjectStoreError, StoreDenied, StoreUnreachable
from omlx.adapters.objectstore.location import (
    S3Access,
    S3Location,
    is_object_store_url,
    resolve_access,
)
from omlx.adapters.objectstore.read_through import LocalCopyStats, ReadThroughStore
from omlx.adapters.objectstore.s3 import S3BlockStore

READ_THROUGH_DIR = ".read-through"  # under the cache folder; hidden from its block walk


def open_object_store(url: str, cache_dir: Path, local_max_bytes: int) -> ReadThroughStore:
    """The bucket ``url`` names (``s3://bucket/prefix``) with its local copies under
    ``<cache_dir>/.read-through/<bucket>/<prefix>``; ValueError for a bad URL or no credentials."""
    location = S3Location.parse(url)
    remote = S3BlockStore(location, resolve_access())
    local_dir = cache_dir / READ_THROUGH_DIR / location.bucket / location.prefix
    local = FileBlockStore(local_dir, durable=False)
    return ReadThroughStore(remote, local, local_max_bytes)


__all__ = [
    "READ_THROUGH_DIR",
    "LocalCopyStats",
    "ObjectStoreError",
    "ReadThroughStore",
    "S3Access",
    "S3BlockStore",
    "S3Location",
    "StoreDenied",
    "StoreUnreachable",
    "is_object_store_url",
    "open_object_store",
    "resolve_access",
]
