"""The SSD tier of the library API, opened by the server's own wiring (``adapters.cold_folder``).

The same folder lock, SQLite (or PostgreSQL) index, block store, writer thread, budget
and domain cold tier: blocks saved here sit beside the server's, under their own
namespace, counted against one budget and evicted in one LRU order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omlx.adapters.blockfiles.format import pack_layers, unpack_block, unpack_layers
from omlx.adapters.blockfiles.lock import CacheDirLocked
from omlx.adapters.cold_folder import open_cold_folder, start_cold_writer
from omlx.cache.layers import from_tensors, to_tensors
from omlx.domain.cache.blocks import BlockMeta, DecodedBlock, NamespaceInfo, StoredBlock
from omlx.domain.cache.cold_tier import ColdTier
from omlx.domain.cache.keys import EXTERNAL, external_key

log = logging.getLogger(__name__)

LEASE_S = 60.0  # a shared index: blocks any process used this recently are never evicted
# How often the idle writer wakes (to flush recency, or to see close()): a script's exit
# waits up to this long for it, where a server's once-a-second tick would cost a second.
WRITER_TICK_S = 0.1
_POLL_S = 0.005


@dataclass(frozen=True, slots=True)
class Loaded:
    """A block read back from its file: its entries as MLX arrays and the tokens it covers."""

    layers: list[Any]
    token_count: int
    nbytes: int


def decode(data: bytes) -> DecodedBlock:
    """An external block file's entries, copied into MLX (on the caller's thread)."""
    tokens, tensors, metadata = unpack_block(data)  # validates every kind's layout
    if metadata.get("kind") != EXTERNAL:
        raise ValueError(f"a {metadata.get('kind', 'kv')!r} object is no library block")
    layers = from_tensors(unpack_layers(tensors, metadata))
    nbytes = sum(t.nbytes for t in tensors.values())
    return DecodedBlock(tokens, Loaded(layers, int(metadata["token_count"]), nbytes), metadata)


def _check_object_store(store: Any, url: str) -> None:
    """One request at open: refused keys or no such bucket raise; no answer is one warning
    (blocks are then misses until the store answers)."""
    from omlx.adapters.objectstore import StoreDenied, StoreUnreachable

    try:
        store.check()
    except StoreDenied as exc:
        raise RuntimeError(f"object store refused: {exc}") from None
    except StoreUnreachable as exc:
        log.warning(
            "object store %s does not answer (%s); blocks are misses until it does", url, exc
        )


class DiskTier:
    """One namespace's blocks in a cache folder; owns the folder lock, the index and the writer."""

    def __init__(
        self,
        cache_dir: str | Path,
        namespace: NamespaceInfo,
        max_bytes: int,
        *,
        index_url: str | None = None,
        block_store: str = "",
        is_pinned: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self.cache_dir = Path(cache_dir).expanduser()
        self.namespace = namespace
        try:
            self._folder = open_cold_folder(self.cache_dir, index_url, block_store=block_store)
        except CacheDirLocked as exc:
            raise RuntimeError(
                f"cache folder {self.cache_dir} is in use by "
                f"{f'process {exc.pid}' if exc.pid else 'another process'} (an omlx server or "
                "another cache with an embedded index); close it, or use another folder"
            ) from None
        try:
            if block_store:
                _check_object_store(self._folder.store, block_store)
            # Listed by `omlx admin cache stats` from now on.
            self._folder.index.upsert_namespace(namespace)
        except BaseException:
            self._folder.close()
            raise
        folder = self._folder
        self.shared, self.index, self.store = folder.shared, folder.index, folder.store
        self._writer = start_cold_writer(
            self._folder, max_bytes, is_pinned=is_pinned, lease=LEASE_S, tick_interval=WRITER_TICK_S
        )
        self.writer = self._writer.writer
        self.cold = ColdTier(
            namespace,
            self.store,
            self.index,
            self.writer,
            decode,
            recency=self._writer.recency,
            # The library's blocks are its caller's layers, not a model's computed KV: no
            # model here to compare them with; their key and checksum are their check.
            check=lambda data, meta, **_: None,
            drop_missing_rows=not self.shared,
        )
        self.closed = False

    def key(self, block_hash: bytes) -> str:
        return external_key(self.namespace.digest, block_hash)

    def put(self, block_hash: bytes, layers: list[Any], token_count: int) -> None:
        """Encode the (evaluated) entries here and queue the bytes; the disk is never waited for."""
        meta = BlockMeta(
            self.key(block_hash), block_hash.hex(), self.namespace.digest, token_count, EXTERNAL
        )
        self.cold.put(meta, (), pack_layers(meta, to_tensors(layers)))

    def get(self, block_hash: bytes) -> Loaded | None:
        """The block from its file, verified, or None (a missing or bad block: dropped, logged)."""
        found = self.cold.get(self.key(block_hash), block_hash.hex())
        return None if found is None else found[1]

    def contains(self, block_hash: bytes) -> bool:
        """On disk or queued for it."""
        return self.cold.contains(self.key(block_hash))

    def touch(self, block_hash: bytes) -> None:
        self.cold.touch([self.key(block_hash)])

    def rows(self) -> list[StoredBlock]:
        """This namespace's blocks in the index, once the writes queued so far have landed."""
        self.wait_for_writes()
        self.cold.flush()  # last access times as of now
        digest = self.namespace.digest
        return [b for b in self.index.iter_blocks() if b.namespace == digest and b.kind == EXTERNAL]

    def wait_for_writes(self, timeout: float = 30.0) -> bool:
        """Wait until no block is queued; False when some still are after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while self.writer.pending_keys():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def stats(self) -> dict[str, Any]:
        return {"disk": asdict(self.cold.stats()), "writer": asdict(self.writer.stats())}

    def close(self, timeout: float = 30.0) -> None:
        """Drain the writer, save recency, stop the read threads, close the index, unlock."""
        if self.closed:
            return
        self.closed = True
        try:
            self._writer.close(timeout)  # then recency, so LRU order survives
        finally:
            self._folder.close()
