"""The cold tier as a pure domain service: over the fakes of its ports, no files, no database.

What it decides, per read the store hands back: serve (tokens rehash to the key), drop
(row first, then file) or leave the row and miss (a file missing on a shared folder, an
I/O error, a read past its time budget); an unreachable index is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_tier import ColdTier, RecencyBuffer
from omlx.domain.cache.eviction import evict
from omlx.domain.cache.keys import block_key, namespace_digest
from tests.fakes import FakeBlockIndex, FakeBlockSink, FakeBlockStore, FakeClock, FakeCodec

BLOCK = 4


@dataclass
class Rig:
    tier: ColdTier
    store: FakeBlockStore
    index: FakeBlockIndex
    sink: FakeBlockSink
    clock: FakeClock
    chain: list[tuple[BlockMeta, tuple[int, ...], bytes]]

    def pairs(self) -> list[tuple[str, str]]:
        return [(m.key, m.parent_key) for m, _, _ in self.chain]

    def row(self, i: int):
        return self.index.blocks[self.chain[i][0].key]


def _namespace(name: str = "tiny") -> NamespaceInfo:
    return NamespaceInfo(namespace_digest({"m": name}), name, f"/m/{name}", BLOCK, "f32", 2)


def _chain(
    ns: NamespaceInfo, n: int, start: int = 0
) -> list[tuple[BlockMeta, tuple[int, ...], bytes]]:
    codec = FakeCodec()
    parent, out = ns.digest, []
    for i in range(n):
        tokens = tuple(range(start + i * BLOCK, start + (i + 1) * BLOCK))
        meta = BlockMeta(block_key(parent, tokens), parent, ns.digest, BLOCK)
        out.append((meta, tokens, codec.encode(tuple(t * 10 for t in tokens), tokens, meta)))
        parent = meta.key
    return out


def _rig(n: int = 6, *, drop_missing_rows: bool = True) -> Rig:
    ns, clock = _namespace(), FakeClock()
    store, index = FakeBlockStore(), FakeBlockIndex()
    sink = FakeBlockSink(store, index, clock)
    codec = FakeCodec()
    tier = ColdTier(
        ns,
        store,
        index,
        sink,
        codec.decode,
        clock,
        RecencyBuffer(index, clock),
        check=codec.check,
        drop_missing_rows=drop_missing_rows,
    )
    chain = _chain(ns, n)
    for meta, tokens, data in chain:
        clock.advance()
        tier.put(meta, tokens, data)
        sink.drain()  # one write per tick: LRU order is chain order
    return Rig(tier, store, index, sink, clock, chain)


@pytest.fixture
def rig() -> Iterator[Rig]:
    yield _rig()


def _served(rig: Rig, upto: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return [(tokens, tuple(t * 10 for t in tokens)) for _, tokens, _ in rig.chain[:upto]]


def test_put_queues_then_get_many_serves_the_chain_and_records_hits(rig: Rig) -> None:
    assert list(rig.tier.get_many(rig.pairs())) == _served(rig, 6)
    assert (rig.tier.stats().hits, rig.tier.stats().misses, rig.tier.stats().queued) == (6, 0, 6)
    assert rig.index.lookups == 1  # one index query for the whole chain
    rig.tier.flush()
    assert all(b.hit_count == 1 for b in rig.index.blocks.values())


def test_a_queued_block_is_contained_before_it_is_on_disk(rig: Rig) -> None:
    ((meta, tokens, data),) = _chain(rig.tier.namespace, 1, start=900)
    rig.tier.put(meta, tokens, data)
    assert rig.tier.contains(meta.key) and meta.key not in rig.index.blocks
    assert rig.tier.get(meta.key, meta.parent_key) is None  # not served before it is written
    rig.sink.drain()
    assert rig.tier.get(meta.key, meta.parent_key) == (tokens, tuple(t * 10 for t in tokens))


def test_put_refuses_a_foreign_block_and_counts_a_full_queue(rig: Rig) -> None:
    meta, tokens, data = _chain(_namespace("other"), 1)[0]
    rig.tier.put(meta, tokens, data)
    rig.sink.accept = False
    mine = _chain(rig.tier.namespace, 1, start=500)[0]
    rig.tier.put(*mine)
    assert rig.tier.stats().dropped == 2 and rig.sink.queue == {}


def test_a_checksum_mismatch_is_dropped_row_first(rig: Rig) -> None:
    row = rig.row(2)
    rig.store.files[row.relpath] = rig.store.files[row.relpath][:-1]
    assert list(rig.tier.get_many(rig.pairs())) == _served(rig, 2)
    assert row.key not in rig.index.blocks and row.relpath not in rig.store.files
    assert rig.tier.stats().corrupt_blocks == 1
    assert rig.store.reads == [rig.row(i).relpath for i in range(2)] + [row.relpath]  # no further


def test_tokens_that_do_not_rehash_are_dropped(rig: Rig) -> None:
    # A consistent row and file whose tokens belong to another block.
    row, other = rig.row(1), rig.chain[3][2]
    rig.store.files[row.relpath] = other
    rig.index.blocks[row.key] = replace(
        row, nbytes=len(other), checksum=hashlib.sha256(other).hexdigest()
    )
    assert rig.tier.get(row.key, row.parent_key) is None
    assert rig.tier.stats().corrupt_blocks == 1 and row.key not in rig.index.blocks


def test_undecodable_bytes_are_dropped_not_raised(rig: Rig) -> None:
    row = rig.row(0)
    junk = json.dumps({"tokens": "nope"}).encode()
    rig.store.files[row.relpath] = junk
    rig.index.blocks[row.key] = replace(
        row, nbytes=len(junk), checksum=hashlib.sha256(junk).hexdigest()
    )
    assert rig.tier.get(row.key, row.parent_key) is None
    assert rig.tier.stats().corrupt_blocks == 1


def test_missing_file_owned_folder_drops_the_row() -> None:
    rig = _rig(3)
    del rig.store.files[rig.row(1).relpath]
    assert list(rig.tier.get_many(rig.pairs())) == _served(rig, 1)
    assert rig.chain[1][0].key not in rig.index.blocks
    assert rig.tier.stats().missing_files == 1


def test_missing_file_shared_folder_is_a_miss_and_keeps_the_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = _rig(3, drop_missing_rows=False)
    row = rig.row(1)
    file = rig.store.files.pop(row.relpath)  # not visible to this host yet (NFS lookup cache)
    with caplog.at_level(logging.INFO):
        assert list(rig.tier.get_many(rig.pairs())) == _served(rig, 1)
    assert row.key in rig.index.blocks and "its row is left" in caplog.text
    assert (rig.tier.stats().missing_files, rig.tier.stats().corrupt_blocks) == (1, 0)
    rig.store.files[row.relpath] = file  # the share shows it now: served, nothing lost
    assert list(rig.tier.get_many(rig.pairs())) == _served(rig, 3)


@pytest.mark.parametrize("failure", ["unreadable", "slow"])
def test_io_errors_and_timeouts_are_misses_that_keep_the_row(rig: Rig, failure: str) -> None:
    getattr(rig.store, failure).add(rig.row(3).relpath)
    assert list(rig.tier.get_many(rig.pairs())) == _served(rig, 3)
    assert len(rig.index.blocks) == 6 and len(rig.store.files) == 6
    assert rig.tier.stats().corrupt_blocks == rig.tier.stats().missing_files == 0


def test_an_unreachable_index_is_a_miss_everywhere(rig: Rig) -> None:
    rig.index.down = True
    assert list(rig.tier.get_many(rig.pairs())) == []
    assert rig.tier.get(*rig.pairs()[0]) is None
    assert rig.tier.children(rig.tier.namespace.digest) == []
    assert not rig.tier.contains(rig.chain[0][0].key)
    rig.tier.touch([rig.chain[0][0].key])
    assert rig.tier.flush() == 0 and rig.tier.recency.pending() == 1  # kept for later
    rig.index.down = False
    assert rig.tier.flush() == 1
    assert rig.tier.stats().misses == 2


def test_closing_get_many_early_closes_the_store_batch(rig: Rig) -> None:
    batch = rig.tier.get_many(rig.pairs())
    assert next(batch) == _served(rig, 1)[0]
    batch.close()
    assert len(rig.store.reads) == 1  # the fake reads lazily: nothing past what was taken
    rig.tier.close()
    assert rig.store.closed == 1


def test_children_are_this_namespaces_rows_only(rig: Rig) -> None:
    root = rig.chain[0][0].key
    foreign = replace(rig.row(1), key="f" * 64, namespace=_namespace("other").digest)
    rig.index.blocks[foreign.key] = foreign
    assert [c.key for c in rig.tier.children(root)] == [rig.chain[1][0].key]


def test_rows_and_children_name_the_server_that_computed_each_block(rig: Rig) -> None:
    named = replace(rig.row(1), computed_by="studio-2")
    rig.index.blocks[named.key] = named
    root, key = rig.chain[0][0].key, rig.chain[1][0].key
    assert [c.computed_by for c in rig.tier.children(root)] == ["studio-2"]
    assert [c.computed_by for c in rig.tier.children(root, rig.chain[1][1])] == ["studio-2"]
    assert rig.tier.rows([rig.chain[0][0].key, key])[key].computed_by == "studio-2"


def test_a_long_chain_asks_the_index_for_its_head_first() -> None:
    """A new 40-block prompt costs one small query; a stored one is served whole in two."""
    rig = _rig(40)
    stored = rig.pairs()
    unknown = [(k[::-1], p[::-1]) for k, p in stored]
    asked: list[int] = []
    get_blocks = rig.index.get_blocks

    def counting(keys):
        asked.append(len(keys))
        return get_blocks(keys)

    rig.index.get_blocks = counting
    assert list(rig.tier.get_many(unknown)) == []
    assert asked == [16]
    asked.clear()
    assert len(list(rig.tier.get_many(stored))) == 40
    assert asked == [16, 24]


def test_a_new_prompt_lists_only_children_it_can_rank_without_reading() -> None:
    """Twenty conversations under one root, recorded with their tokens, and a prompt none
    of them continues: the nearest few are listed with their tokens (ranked for free), the
    recent ones are not listed again, and a row recorded without tokens still is."""
    rig = _rig(0)
    ns = rig.tier.namespace
    for i in range(20):
        tokens = tuple(range(1000 * (i + 1), 1000 * (i + 1) + BLOCK))
        meta = BlockMeta(block_key(ns.digest, tokens), ns.digest, ns.digest, BLOCK)
        rig.clock.advance()
        rig.tier.put(meta, tokens, FakeCodec().encode(tokens, tokens, meta))
        rig.sink.drain()
    want = tuple(range(50, 50 + BLOCK))
    listed = rig.tier.children(ns.digest, want)
    assert 0 < len(listed) <= 8 and all(m.tokens for m in listed)
    newest = rig.clock.advance()
    headless = replace(rig.index.blocks[listed[0].key], key="e" * 64, last_access=newest)
    rig.index.blocks[headless.key] = headless  # a row written before tokens were recorded
    listed = rig.tier.children(ns.digest, want)
    assert [m.key for m in listed if not m.tokens] == [headless.key]
    # Without a prompt to rank against (``probe``), the most recent of all, as before.
    assert len(rig.tier.children(ns.digest)) == 16


def test_evict_frees_down_to_the_budget_lru_first_skipping_pins_and_the_lease(rig: Rig) -> None:
    size = rig.row(0).nbytes
    kept = sum(rig.row(i).nbytes for i in (0, 3, 4, 5))
    pinned = {rig.chain[0][0].key}
    # Lease: blocks used at or after the fourth write's time stay whatever the budget says.
    lease_cutoff = rig.row(3).last_access
    victims = evict(rig.index, rig.store, size, pinned.__contains__, accessed_before=lease_cutoff)
    assert [v.key for v in victims or []] == [rig.chain[i][0].key for i in (1, 2)]
    assert all(v.relpath not in rig.store.files for v in victims or [])  # files after rows
    assert rig.index.total_bytes() == kept > size  # over budget: the rest is pinned or leased
    rig.index.evicting_elsewhere = True
    assert evict(rig.index, rig.store, 0, lambda key: False) is None
    assert len(rig.index.blocks) == 4


def test_a_flush_waits_for_the_one_already_writing():
    """The writer thread's periodic flush holds a batch in ``touch``: a flush meanwhile
    (shutdown, a test reading hit counts) returns only once that batch is committed."""
    import threading

    class SlowIndex(FakeBlockIndex):
        def __init__(self) -> None:
            super().__init__()
            self.entered, self.release, self.touched = threading.Event(), threading.Event(), []

        def touch(self, hits) -> None:
            self.entered.set()
            assert self.release.wait(10)
            self.touched.append(dict(hits))

    index = SlowIndex()
    recency = RecencyBuffer(index, FakeClock())
    recency.record(["k1"])
    periodic = threading.Thread(target=recency.flush)
    periodic.start()
    assert index.entered.wait(10)
    returned = threading.Event()
    caller = threading.Thread(target=lambda: (recency.flush(), returned.set()))
    caller.start()
    assert not returned.wait(0.2)  # still writing k1: the second flush waits for it
    index.release.set()
    assert returned.wait(10)
    assert [list(batch) for batch in index.touched] == [["k1"]]
    periodic.join()
    caller.join()
