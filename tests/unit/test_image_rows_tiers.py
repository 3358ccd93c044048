"""Image rows in the block cache's tiers, as a pure domain service over the fakes of its ports.

Rows are kept in the hot tier (its budget and eviction order) and queued for the cold tier
(files and index rows beside the blocks: its budget, LRU eviction, recency); a fresh RAM
tier (a restart) reads them back from disk; a tenant's rows are its own on every tier; a
no-store read changes nothing; a bad file is removed, never served.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_tier import ColdTier, RecencyBuffer
from omlx.domain.cache.cold_writes import ColdWrites
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.image_rows import ImageRowsTiers
from omlx.domain.cache.keys import IMAGE, block_key, namespace_digest, rederives
from tests.fakes import (
    FakeBlockIndex,
    FakeBlockSink,
    FakeBlockStore,
    FakeByteBudget,
    FakeClock,
    FakeCodec,
)

DIGEST = "ab" * 32
OTHER = "cd" * 32


class ListRowsCodec:
    """Rows as a tuple of float tuples; a file is their JSON with the object's names."""

    def __init__(self) -> None:
        self.decodes = 0

    def info(self, payload):
        return len(payload), len(payload[0]), "F32"

    def nbytes(self, payload):
        return 4 * len(payload) * len(payload[0])

    def encode(self, payload, meta: BlockMeta) -> bytes:
        assert meta.image is not None
        doc = {"rows": payload, "key": meta.key, "anchor": meta.parent_key}
        return json.dumps(doc | {"digest": meta.image.digest}).encode()

    def decode(self, data: bytes, meta: BlockMeta):
        self.decodes += 1
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        if doc["key"] != meta.key or doc["anchor"] != meta.parent_key:
            raise ValueError("another object's rows")
        return tuple(tuple(r) for r in doc["rows"])


def rows(n: int, value: float = 1.0) -> tuple[tuple[float, ...], ...]:
    return tuple((value, value + i) for i in range(n))  # 8 bytes a row


@dataclass
class Rig:
    ns: NamespaceInfo
    store: FakeBlockStore
    index: FakeBlockIndex
    sink: FakeBlockSink
    clock: FakeClock
    cold: ColdTier
    codec: ListRowsCodec

    def tiers(self, hot_bytes: int = 1 << 20) -> tuple[ImageRowsTiers, HotTier]:
        """The model's tiers as a (re)started server builds them: a fresh RAM tier."""
        hot = HotTier(hot_bytes)
        return ImageRowsTiers(self.ns.digest, self.codec, hot, self.cold), hot


def _rig() -> Rig:
    ns = NamespaceInfo(namespace_digest({"m": "vlm"}), "vlm", "/m/vlm", 4, "f32", 2)
    clock, store, index = FakeClock(), FakeBlockStore(), FakeBlockIndex()
    sink = FakeBlockSink(store, index, clock)
    blocks = FakeCodec()
    cold = ColdTier(
        ns,
        store,
        index,
        sink,
        blocks.decode,
        clock,
        RecencyBuffer(index, clock),
        check=blocks.check,
    )
    return Rig(ns, store, index, sink, clock, cold, ListRowsCodec())


def test_rows_are_kept_in_ram_and_on_disk_and_a_restart_reads_them_back() -> None:
    rig = _rig()
    tiers, hot = rig.tiers()
    tiers.put(DIGEST, None, rows(3))
    assert tiers.get(DIGEST, None) == rows(3)  # from RAM
    assert hot.stats().bytes == 24 and tiers.held() == (1, 24)
    assert rig.sink.drain() == 1
    ((key, row),) = rig.index.blocks.items()
    assert row.kind == IMAGE and row.token_count == 3 and row.namespace == rig.ns.digest
    assert rederives(IMAGE, key, row.parent_key, (), rig.ns.digest)
    image = rig.index.images[key]
    assert (image.digest, image.tenant, image.rows, image.hidden, image.dtype) == (
        DIGEST,
        "",
        3,
        2,
        "F32",
    )

    again, hot = rig.tiers()  # a restart: RAM is empty, the disk is not
    rig.clock.advance(10)
    assert again.get(DIGEST, None) == rows(3)
    assert again.stats().ssd_hits == 1 and hot.stats().bytes == 24  # read back into RAM
    rig.cold.flush()
    assert (
        rig.index.blocks[key].hit_count == 1
        and rig.index.blocks[key].last_access == row.last_access + 10
    )
    assert again.get(DIGEST, None) == rows(3) and again.stats().ram_hits == 1
    assert again.get(OTHER, None) is None and again.stats().misses == 1


def test_a_tenants_rows_are_its_own_on_every_tier() -> None:
    rig = _rig()
    tiers, _ = rig.tiers()
    tiers.put(DIGEST, "acme", rows(2))
    rig.sink.drain()
    assert tiers.get(DIGEST, None) is None and tiers.get(DIGEST, "other") is None
    assert tiers.get(DIGEST, "acme") == rows(2)
    assert [i.tenant for i in rig.index.images.values()] == ["acme"]
    fresh, _ = rig.tiers()
    assert fresh.get(DIGEST, None) is None and fresh.get(DIGEST, "acme") == rows(2)
    assert tiers.key(DIGEST, "acme") != tiers.key(DIGEST, None) != tiers.key(DIGEST, "other")


def test_a_no_store_read_keeps_nothing_and_touches_nothing() -> None:
    rig = _rig()
    tiers, _ = rig.tiers()
    tiers.put(DIGEST, None, rows(2))
    rig.sink.drain()
    fresh, hot = rig.tiers()
    rig.clock.advance(10)
    assert fresh.get(DIGEST, None, store=False) == rows(2)
    rig.cold.flush()
    (row,) = rig.index.blocks.values()
    assert row.hit_count == 0 and row.last_access == rig.clock.now() - 10
    assert hot.stats().blocks == 0 and fresh.held() == (0, 0)


def test_a_file_that_is_not_its_rows_is_removed_row_first_never_served() -> None:
    rig = _rig()
    tiers, _ = rig.tiers()
    tiers.put(DIGEST, None, rows(2))
    tiers.put(OTHER, None, rows(2, 5.0))
    rig.sink.drain()
    key, _ = tiers.key(DIGEST, None)
    other_key, _ = tiers.key(OTHER, None)
    # Swap the two files' bytes and rows' checksums: each row now names the other's rows.
    a, b = rig.index.blocks[key], rig.index.blocks[other_key]
    rig.index.blocks[key] = type(a)(
        **{**_fields(a), "relpath": b.relpath, "checksum": b.checksum, "nbytes": b.nbytes}
    )
    fresh, _ = rig.tiers()
    assert fresh.get(DIGEST, None) is None
    assert key not in rig.index.blocks and key not in rig.index.images
    assert fresh.stats().rejected == 1 and b.relpath not in rig.store.files
    assert fresh.get(OTHER, None) is None  # its file went with the bad row: a miss, not an error


def test_rows_count_against_the_hot_tiers_budget_with_its_blocks() -> None:
    rig = _rig()
    tiers, hot = rig.tiers(hot_bytes=64)
    block = BlockMeta(block_key(rig.ns.digest, (1, 2, 3, 4)), rig.ns.digest, rig.ns.digest, 4)
    assert hot.put(block, (1, 2, 3, 4), (10, 20, 30, 40), 32)
    tiers.put(DIGEST, None, rows(3))  # 24 bytes: fits beside the block
    assert hot.stats().bytes == 56
    tiers.put(OTHER, None, rows(3))  # 24 more: the least recently used goes
    assert hot.stats().bytes <= 64 and block.key not in hot
    assert tiers.held() == (2, 48)


def test_rows_on_disk_count_against_the_cold_budget_and_are_evicted_lru_with_blocks() -> None:
    rig = _rig()
    tiers, _ = rig.tiers()
    tiers.put(DIGEST, None, rows(3))
    rig.sink.drain()
    (image_row,) = rig.index.blocks.values()
    writes = ColdWrites(
        rig.store, rig.index, FakeByteBudget(image_row.nbytes + 100), clock=rig.clock
    )
    rig.clock.advance()
    meta = BlockMeta(block_key(rig.ns.digest, (9,)), rig.ns.digest, rig.ns.digest, 1)
    assert writes.admit(meta, rig.ns, 100) is None  # room, with the image's bytes counted
    assert rig.index.total_bytes() == image_row.nbytes
    rig.store.write("x", b"x" * 100)
    writes.record(rig.ns, meta, "x", "0" * 64, 100)
    rig.clock.advance()
    later = BlockMeta(block_key(meta.key, (10,)), meta.key, rig.ns.digest, 1)
    assert writes.admit(later, rig.ns, 50) is None  # the oldest, the image's rows, goes first
    assert image_row.key not in rig.index.blocks and image_row.key not in rig.index.images
    assert image_row.relpath not in rig.store.files and meta.key in rig.index.blocks


def _fields(row):
    return {f: getattr(row, f) for f in row.__slots__}


def test_dropping_ram_keeps_the_files_and_the_next_get_reads_them() -> None:
    rig = _rig()
    tiers, hot = rig.tiers()
    tiers.put(DIGEST, None, rows(2))
    rig.sink.drain()
    assert tiers.drop_ram() == 1 and hot.stats().bytes == 0 and tiers.held() == (0, 0)
    assert tiers.get(DIGEST, None) == rows(2) and tiers.stats().ssd_hits == 1
