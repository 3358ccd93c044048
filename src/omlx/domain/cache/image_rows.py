"""Image rows in the block cache's tiers: a VLM's encoder output, kept like its KV blocks.

An image's *rows* (its vision encoder's output in the language model's embedding space)
are an object of kind ``image`` keyed by the tenant's chain root and the image's digest
(``keys.image_rows_key``): in RAM they are hot-tier objects (its byte budget, its eviction
order, the memory account), on disk files the block writer writes and the index records
beside the blocks (the cold tier's budget, LRU eviction, reconcile), with an ``images``
row saying which image, whose and what shape. So after a restart a prompt that changed
around an image it showed before reads the rows back instead of running the encoder.

A no-store request reads rows without touching their recency and keeps none. Another
tenant's root names other keys, so one tenant's rows are never another's hit. Called on
the engine thread, except ``stats``. Standard library only.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from omlx.domain.cache.blocks import BlockMeta, ImageInfo
from omlx.domain.cache.cold_tier import ColdTier
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import IMAGE, image_rows_key, tenant_root
from omlx.domain.cache.tally import Tally

log = logging.getLogger(__name__)


class RowsCodec(Protocol):
    """An engine's image rows as a file's bytes and back (engine thread)."""

    def encode(self, payload: Any, meta: BlockMeta) -> bytes:
        """The file of ``payload``, the rows ``meta`` (its ``image`` set) names."""
        ...

    def decode(self, data: bytes, meta: BlockMeta) -> Any:
        """The rows a file holds; ``ValueError`` unless they are the object ``meta`` names."""
        ...

    def info(self, payload: Any) -> tuple[int, int, str]:
        """The rows' count, width and dtype (safetensors spelling)."""
        ...

    def nbytes(self, payload: Any) -> int: ...


@dataclass(frozen=True, slots=True)
class ImageRowsStats:
    """Counters of one model's image rows in the tiers: lookups found in RAM or on disk,
    rows kept (RAM) and queued for disk, files refused."""

    ram_hits: int = 0
    ssd_hits: int = 0
    misses: int = 0
    kept: int = 0
    queued: int = 0
    rejected: int = 0


class ImageRowsTiers:
    """Image rows by (tenant, digest) in one namespace's hot tier and cold tier (if any)."""

    def __init__(
        self,
        namespace: str,
        codec: RowsCodec,
        hot: HotTier,
        cold: ColdTier | None = None,
    ) -> None:
        self.namespace = namespace
        self._codec, self._hot, self._cold = codec, hot, cold
        self._tally = Tally()
        self._lock = threading.Lock()
        self._kept: set[str] = set()  # keys put in RAM (the hot tier may have evicted some)

    @property
    def budget_bytes(self) -> int:
        """The RAM budget the rows share with the model's blocks."""
        return self._hot.max_bytes

    @property
    def on_disk(self) -> bool:
        return self._cold is not None

    def stats(self) -> ImageRowsStats:
        return self._tally.read_as(ImageRowsStats)

    def held(self) -> tuple[int, int]:
        """How many images' rows RAM holds now, and their bytes (any thread)."""
        with self._lock:  # then the hot tier's lock: never the other way round
            sizes = self._hot.sizes(self._kept)
            self._kept.intersection_update(sizes)
        return len(sizes), sum(sizes.values())

    def in_ram(self, digest: str, tenant: str | None) -> bool:
        """Whether RAM holds the rows of ``digest`` for ``tenant`` now."""
        return self.key(digest, tenant)[0] in self._hot

    def drop_ram(self) -> int:
        """Drop every image's rows from RAM (their files stay); how many were held."""
        with self._lock:
            kept, self._kept = self._kept, set()
        return self._hot.discard(kept)

    def key(self, digest: str, tenant: str | None) -> tuple[str, str]:
        """The rows' key and anchor for ``tenant`` (None or "": the default tenant)."""
        root = tenant_root(self.namespace, tenant) if tenant else self.namespace
        return image_rows_key(root, digest)

    def get(self, digest: str, tenant: str | None, *, store: bool = True) -> Any | None:
        """The rows of ``digest`` for ``tenant`` from RAM, else from disk, else None.

        ``store``: a storing request, whose hit counts in the cold tier's recency and whose
        disk read is kept in RAM; a no-store request's read changes neither.
        """
        key, anchor = self.key(digest, tenant)
        held = self._hot.get(key, count=False)
        if held is not None:
            self._tally.add(ram_hits=1)
            if store and self._cold is not None:
                self._cold.touch([key])
            return held.payload
        read = self._cold.read_object(key, IMAGE) if self._cold is not None else None
        if read is None:
            self._tally.add(misses=1)
            return None
        row, data = read
        meta = BlockMeta(key, anchor, self.namespace, row.token_count, IMAGE)
        try:
            payload = self._codec.decode(data, meta)
        except ValueError as exc:
            log.warning(
                "image rows %s (%s) are not served: %s; removing them", key, row.relpath, exc
            )
            assert self._cold is not None
            self._cold.forget([key])
            self._tally.add(rejected=1, misses=1)
            return None
        self._tally.add(ssd_hits=1)
        if store:
            assert self._cold is not None
            self._cold.touch([key])
            nbytes = self._codec.nbytes(payload)
            if self._hot.put(meta, (), payload, nbytes, reused=True):
                self._kept_in_ram(key)
        return payload

    def _kept_in_ram(self, key: str) -> None:
        self._tally.add(kept=1)
        with self._lock:
            self._kept.add(key)

    def put(self, digest: str, tenant: str | None, payload: Any) -> None:
        """Keep freshly encoded rows: in RAM, and queued for disk unless already there."""
        key, anchor = self.key(digest, tenant)
        rows, hidden, dtype = self._codec.info(payload)
        image = ImageInfo(digest, tenant or "", rows, hidden, dtype)
        meta = BlockMeta(key, anchor, self.namespace, rows, IMAGE, image=image)
        if self._hot.put(meta, (), payload, self._codec.nbytes(payload)):
            self._kept_in_ram(key)
        if self._cold is None or self._cold.contains(key):
            return
        try:
            data = self._codec.encode(payload, meta)
        except Exception:  # a codec bug must not fail the request: the rows are in hand
            log.exception("image rows %s could not be encoded; not stored", key)
            return
        self._cold.put(meta, (), data)
        self._tally.add(queued=1)
