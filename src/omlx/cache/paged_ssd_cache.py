"""``PagedSSDCacheManager``: a model's caller-keyed blocks in RAM, and on disk beside the server's.

Saving never waits for the disk: the arrays are made compact and kept in RAM, encoded to
bytes on the caller's thread and queued for the writer thread, which writes the file and
then the index row, within the folder's budget (LRU first, the server's blocks and these
alike). Loading serves RAM first, then the file, once it matches its row's checksum;
a bad file is dropped and reported as a miss.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from omlx.cache.disk import DiskTier
from omlx.cache.layers import checked, compact, shared
from omlx.cache.paged_cache import PagedCache
from omlx.domain.cache.blocks import NamespaceInfo
from omlx.domain.cache.keys import EXTERNAL, EXTERNAL_HASH_MAX, namespace_digest
from omlx.domain.tier_defaults import COLD_TIER_DEFAULT_BYTES, HOT_TIER_DEFAULT_BYTES


def library_namespace(model_name: str, block_size: int) -> NamespaceInfo:
    """The namespace of a model's library blocks: its name and block size (and the format).

    Callers key these blocks themselves, so no weights or tokenizer enter the digest; a
    library namespace never equals a server's, whose identity is the model's files.
    """
    if not model_name:
        raise ValueError("model_name must not be empty")
    digest = namespace_digest(
        {"kind": EXTERNAL, "model_name": model_name, "block_size": block_size}
    )
    # No dtype or layer count of its own: each block's file records its arrays' own.
    return NamespaceInfo(digest, model_name, "", block_size, "per-block", 0)


@dataclass(frozen=True, slots=True)
class BlockMetadata:
    """One block on disk, as its index row describes it."""

    block_hash: bytes  # the caller's hash it was saved under
    key: str  # its key in the index (hex): the hash scoped by the model's namespace
    file_size: int
    token_count: int
    last_access: float  # epoch seconds
    created_at: float
    hit_count: int
    path: Path


class PagedSSDCacheIndex:
    """What the index holds for one manager's model; ``get_all_metadata`` lists it."""

    def __init__(self, disk: DiskTier | None) -> None:
        self._disk = disk

    def get_all_metadata(self) -> list[BlockMetadata]:
        """Every block of this model on disk, least recently used first (none in RAM-only mode).

        Waits for the writes queued so far, so a block saved before the call is listed.
        """
        disk = self._disk
        if disk is None:
            return []
        rows = sorted(disk.rows(), key=lambda b: (b.last_access, b.created_at, b.key))
        return [
            BlockMetadata(
                block_hash=bytes.fromhex(b.parent_key),
                key=b.key,
                file_size=b.nbytes,
                token_count=b.token_count,
                last_access=b.last_access,
                created_at=b.created_at,
                hit_count=b.hit_count,
                path=disk.store.path(b.relpath),
            )
            for b in rows
        ]


class PagedSSDCacheManager:
    """Blocks of one model, named by their caller's hash: RAM first, then the SSD tier.

    ``cache_dir`` is the cache folder the server uses too (``~/.omlx/cache`` by default
    there): files go to ``<cache_dir>/<model_name>-<namespace[:12]>/``, rows to
    ``<cache_dir>/index.db`` (or to ``index_url``, a PostgreSQL index shared by servers);
    ``block_store`` (``s3://bucket/prefix``) keeps the blocks in an object store.
    ``max_size_bytes`` is the folder's budget, for every model's blocks together;
    ``hot_cache_max_bytes`` the RAM tier's. With ``hot_cache_only=True`` nothing touches
    the disk: no folder, no index, no writer thread. Otherwise the folder is locked as a
    server locks it until :meth:`close` (also run at interpreter exit, after the queued
    writes land). Call it from the thread that runs your MLX work.
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        max_size_bytes: int = COLD_TIER_DEFAULT_BYTES,
        hot_cache_max_bytes: int = HOT_TIER_DEFAULT_BYTES,
        hot_cache_only: bool = False,
        *,
        model_name: str = "default",
        block_size: int = 64,
        index_url: str | None = None,
        block_store: str = "",
        paged_cache: PagedCache | None = None,
    ) -> None:
        if max_size_bytes < 0 or hot_cache_max_bytes < 0:
            raise ValueError("max_size_bytes and hot_cache_max_bytes must be >= 0")
        self.model_name = model_name
        self.block_size = block_size
        self.hot_cache_only = hot_cache_only
        self.namespace = library_namespace(model_name, block_size)
        # The RAM tier: the paged cache a prefix cache hands over, else one of our own.
        if paged_cache is None:
            paged_cache = PagedCache(hot_cache_max_bytes, block_size=block_size)
        elif paged_cache.block_size != block_size:
            raise ValueError(
                f"the paged cache holds blocks of {paged_cache.block_size} tokens, not {block_size}"
            )
        self.ram = paged_cache
        self._disk: DiskTier | None = None
        if not hot_cache_only:
            if cache_dir is None:
                raise ValueError("cache_dir is required unless hot_cache_only=True")
            self._disk = DiskTier(
                cache_dir,
                self.namespace,
                max_size_bytes,
                index_url=index_url,
                block_store=block_store,
                is_pinned=self.ram.hot.is_pinned,
            )
            # Queued writes land before the process exits, even if close() is never called.
            self._finalizer = weakref.finalize(self, self._disk.close)
        self._index = PagedSSDCacheIndex(self._disk)

    @property
    def cache_dir(self) -> Path | None:
        return None if self._disk is None else self._disk.cache_dir

    @property
    def model_dir(self) -> Path | None:
        """This model's folder of block files (made by the first write)."""
        if self._disk is None:
            return None
        # The store owns the layout: ask it where some block of this namespace would go.
        probe = self._disk.store.relpath(self.namespace, "0" * 64, "0" * 64)
        return self._disk.store.path(probe.split("/", 1)[0])

    def save_block(self, block_hash: bytes, kv_data: Any, token_count: int) -> None:
        """Keep a block in RAM and queue it for disk; returns without waiting for the disk.

        ``kv_data``: one entry per layer, a ``(keys, values)`` tuple of MLX arrays or a
        layer cache's ``state`` (see ``omlx.cache.layers``). A hash names one content:
        saving a hash again only marks it recently used. A full queue or disk drops the
        write (logged), never the call. Raises ``TypeError`` / ``ValueError`` for what
        cannot be stored, naming the entry.
        """
        block_hash = _hash_bytes(block_hash)
        _check_token_count(token_count, self.block_size)
        layers = checked(kv_data)
        in_ram = self.ram.touch(block_hash)
        disk = self._disk
        on_disk = disk is None or disk.contains(block_hash)
        if on_disk and disk is not None:
            disk.touch(block_hash)
        if in_ram and on_disk:
            return
        kept, nbytes = compact(layers)  # evaluated here, on the caller's thread
        if not in_ram:
            self.ram.put(block_hash, kept, nbytes, token_count)
        if not on_disk and disk is not None:
            disk.put(block_hash, kept, token_count)

    def load_block(self, block_hash: bytes) -> list[Any] | None:
        """The block's entries as saved (tuples as tuples), from RAM, else from disk; or None."""
        block_hash = _hash_bytes(block_hash)
        layers = self.ram.get(block_hash)
        disk = self._disk
        if layers is not None:
            if disk is not None:
                disk.touch(block_hash)  # the disk's LRU order sees RAM hits too
            return layers
        loaded = None if disk is None else disk.get(block_hash)
        if loaded is None:
            return None
        self.ram.put(block_hash, loaded.layers, loaded.nbytes, loaded.token_count)
        return shared(loaded.layers)  # the caller's objects, not the RAM tier's

    def has_block(self, block_hash: bytes) -> bool:
        """Whether the block is in RAM, on disk or queued for it (reads no file)."""
        block_hash = _hash_bytes(block_hash)
        return block_hash in self.ram or (
            self._disk is not None and self._disk.contains(block_hash)
        )

    def list_blocks(self) -> list[BlockMetadata]:
        """This model's blocks on disk, least recently used first: key, size, tokens, last access."""
        return self._index.get_all_metadata()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued block is on disk and indexed; False if ``timeout`` ran out."""
        return True if self._disk is None else self._disk.wait_for_writes(timeout)

    def stats(self) -> dict[str, Any]:
        """Counters: the RAM tier's, and the disk's and its writer's when there is a disk."""
        out: dict[str, Any] = {"ram": asdict(self.ram.stats())}
        if self._disk is not None:
            out.update(self._disk.stats())
        return out

    def close(self) -> None:
        """Let queued writes land, record recency, release the folder; RAM blocks stay usable.

        Afterwards the manager works as in RAM-only mode.
        """
        if self._disk is not None:
            self._finalizer()
            self._disk = None
            self._index = PagedSSDCacheIndex(None)

    def __enter__(self) -> PagedSSDCacheManager:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _hash_bytes(block_hash: Any) -> bytes:
    if not isinstance(block_hash, bytes | bytearray | memoryview):
        raise TypeError(
            f"block_hash must be bytes (e.g. a SHA-256 digest), got a {type(block_hash).__name__}"
        )
    value = bytes(block_hash)
    if not 0 < len(value) <= EXTERNAL_HASH_MAX:
        raise ValueError(f"block_hash must be 1 to {EXTERNAL_HASH_MAX} bytes, got {len(value)}")
    return value


def _check_token_count(token_count: Any, block_size: int) -> None:
    if not isinstance(token_count, int) or isinstance(token_count, bool):
        raise TypeError(f"token_count must be an int, got a {type(token_count).__name__}")
    if not 0 <= token_count <= block_size:
        raise ValueError(f"token_count must be 0 to the block size {block_size}, got {token_count}")
