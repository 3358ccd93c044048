"""The cold tier over real files and a real index: verified reads, corruption, the byte budget."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from hashlib import sha256
from pathlib import Path

import pytest

from omlx.adapters.blockfiles.budget import DiskBudget
from omlx.adapters.blockfiles.format import RawTensor, pack_block
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.blockfiles.writer import BlockWriter
from omlx.adapters.sqlindex import SqlBlockIndex, open_index
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_tier import ColdTier, RecencyBuffer
from omlx.domain.cache.keys import block_key
from omlx.domain.cache.partial_match import best_child
from omlx.domain.cache.ports import ColdSource
from tests.fakes import FakeClock
from tests.storage_checks import (
    assert_cache_invariants,
    fake_decode,
    make_chain,
    make_namespace,
    no_model_check,
)

BIG = 10**12


class MeteredStore(FileBlockStore):
    """Tracks the bytes of block files on disk after every write and delete."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.on_disk = 0
        self.peak = 0

    def write(self, relpath: str, data: bytes) -> None:
        super().write(relpath, data)
        self.on_disk += len(data)
        self.peak = max(self.peak, self.on_disk)

    def delete(self, relpath: str) -> None:
        info = self.file_info(relpath)
        super().delete(relpath)
        self.on_disk -= info[0] if info else 0


@contextmanager
def cold_tier(
    tmp_path: Path,
    ns: NamespaceInfo,
    *,
    max_bytes: int = BIG,
    store: FileBlockStore | None = None,
    pinned: frozenset[str] = frozenset(),
    clock: FakeClock | None = None,
) -> Iterator[tuple[ColdTier, BlockWriter, SqlBlockIndex, FakeClock]]:
    """The cold tier wired as the composition root would: one writer thread, one index."""
    clock = clock or FakeClock()
    index = open_index(tmp_path, clock=clock.now)
    recency = RecencyBuffer(index, clock, interval=0.0)
    writer = BlockWriter(
        store or FileBlockStore(tmp_path),
        index,
        DiskBudget(tmp_path, max_bytes=max_bytes, reserve_bytes=0),
        is_pinned=pinned.__contains__,
        clock=clock.now,
        tick=recency.maybe_flush,
        tick_interval=0.01,
    )
    tier = ColdTier(
        ns,
        store or FileBlockStore(tmp_path),
        index,
        writer,
        fake_decode,
        clock,
        recency,
        check=no_model_check,
    )
    try:
        yield tier, writer, index, clock
    finally:
        writer.close(timeout=10)
        tier.close()
        tier.flush()
        index.close()


def _drain(writer: BlockWriter) -> None:
    deadline = time.monotonic() + 10
    while writer.pending_keys() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not writer.pending_keys()


def test_put_then_get_round_trip(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 3)
    with cold_tier(tmp_path, ns) as (tier, writer, index, _):
        source: ColdSource = tier  # the prefix cache's port, checked by type checkers
        del source
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
            assert tier.contains(meta.key)  # queued counts: the block is not queued twice
        _drain(writer)
        for meta, tokens, _ in chain:
            assert tier.get(meta.key, meta.parent_key) == (tokens, ns.layer_count)
        assert tier.get("ab" * 32, ns.digest) is None
        assert not tier.contains("ab" * 32)
        tier.flush()
        assert index.get_blocks([chain[0][0].key])[chain[0][0].key].hit_count == 1
        assert (tier.stats().hits, tier.stats().misses, tier.stats().queued) == (3, 1, 3)
    assert_cache_invariants(tmp_path)


def _damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def _damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", [_damage_flip, _damage_truncate], ids=["flipped-byte", "truncated"]
)
def test_corrupt_block_is_detected_not_served_and_removed(
    tmp_path: Path, damage: object, caplog: pytest.LogCaptureFixture
) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 2)
    with cold_tier(tmp_path, ns) as (tier, writer, index, _):
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
        _drain(writer)
        meta = chain[1][0]
        row = index.get_blocks([meta.key])[meta.key]
        damage(FileBlockStore(tmp_path).path(row.relpath))  # type: ignore[operator]
        with caplog.at_level(logging.WARNING):
            assert tier.get(meta.key, meta.parent_key) is None
        assert "not served" in caplog.text
        assert tier.stats().corrupt_blocks == 1
        assert index.get_blocks([meta.key]) == {}
        assert FileBlockStore(tmp_path).file_info(row.relpath) is None
        assert tier.get(chain[0][0].key, ns.digest) is not None  # its neighbour is fine
    assert_cache_invariants(tmp_path)


def test_tokens_that_do_not_rehash_are_not_served(tmp_path: Path) -> None:
    ns = make_namespace()
    (m0, t0, d0), (_, _, d1) = make_chain(ns, 2)
    with cold_tier(tmp_path, ns) as (tier, writer, index, _):
        tier.put(m0, t0, d0)
        _drain(writer)
        # A checksum-consistent file for key 0 holding block 1's tokens: only the rehash catches it.
        row = index.get_blocks([m0.key])[m0.key]
        FileBlockStore(tmp_path).write(row.relpath, d1)
        index.remove_blocks([m0.key])
        index.add_block(replace(row, nbytes=len(d1), checksum=sha256(d1).hexdigest()))
        assert tier.get(m0.key, m0.parent_key) is None
        assert tier.stats().corrupt_blocks == 1 and not tier.contains(m0.key)
    assert_cache_invariants(tmp_path)


def test_missing_file_drops_the_row(tmp_path: Path) -> None:
    ns = make_namespace()
    ((meta, tokens, data),) = make_chain(ns, 1)
    with cold_tier(tmp_path, ns) as (tier, writer, index, _):
        tier.put(meta, tokens, data)
        _drain(writer)
        FileBlockStore(tmp_path).delete(index.get_blocks([meta.key])[meta.key].relpath)
        assert tier.get(meta.key, meta.parent_key) is None
        assert tier.stats().missing_files == 1 and index.block_count() == 0
    assert_cache_invariants(tmp_path)


def _pairs(chain: list[tuple[BlockMeta, tuple[int, ...], bytes]]) -> list[tuple[str, str]]:
    return [(meta.key, meta.parent_key) for meta, _, _ in chain]


def test_get_many_serves_a_chain_in_order_read_ahead(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 20)
    with cold_tier(tmp_path, ns) as (tier, writer, index, _):
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
        _drain(writer)
        got = list(tier.get_many(_pairs(chain)))
        assert got == [(tokens, ns.layer_count) for _, tokens, _ in chain]
        assert (tier.stats().hits, tier.stats().misses) == (20, 0)
        tier.flush()  # one batch counts a key once: flush between the two reads of block 0
        # A chain longer than the disk's: served up to the first key without a row, one miss.
        tail = ("ab" * 32, chain[-1][0].key)
        assert len(list(tier.get_many([*_pairs(chain[:3]), tail, *_pairs(chain[3:5])]))) == 3
        assert (tier.stats().hits, tier.stats().misses) == (23, 1)
        assert list(tier.get_many([])) == []
        assert list(tier.get_many([tail])) == []
        tier.flush()
        assert index.get_blocks([chain[4][0].key])[chain[4][0].key].hit_count == 1
        assert index.get_blocks([chain[0][0].key])[chain[0][0].key].hit_count == 2
    assert_cache_invariants(tmp_path)


@pytest.mark.parametrize("problem", ["flipped-byte", "missing-file", "other-parent"])
def test_get_many_stops_at_a_bad_block_and_drops_only_it(tmp_path: Path, problem: str) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 12)
    bad = 5
    with cold_tier(tmp_path, ns) as (tier, writer, index, _):
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
        _drain(writer)
        pairs = _pairs(chain)
        row = index.get_blocks([pairs[bad][0]])[pairs[bad][0]]
        path = FileBlockStore(tmp_path).path(row.relpath)
        if problem == "flipped-byte":
            _damage_flip(path)
        elif problem == "missing-file":
            path.unlink()
        else:  # the right file under a parent that does not hash to it
            pairs[bad] = (pairs[bad][0], ns.digest)
        served = list(tier.get_many(pairs))
        assert served == [(tokens, ns.layer_count) for _, tokens, _ in chain[:bad]]
        assert index.get_blocks([pairs[bad][0]]) == {}  # dropped, to be recomputed
        assert FileBlockStore(tmp_path).file_info(row.relpath) is None
        assert len(index.get_blocks([k for k, _ in pairs[bad + 1 :]])) == 12 - bad - 1
        counter = "missing_files" if problem == "missing-file" else "corrupt_blocks"
        assert getattr(tier.stats(), counter) == 1 and tier.stats().hits == bad
    assert_cache_invariants(tmp_path)


def test_get_many_closed_early_stops_reading(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 40)
    reads: list[str] = []

    class CountingStore(FileBlockStore):
        def read(self, relpath: str) -> bytes:
            reads.append(relpath)
            return super().read(relpath)

    with cold_tier(tmp_path, ns, store=CountingStore(tmp_path)) as (tier, writer, _, _):
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
        _drain(writer)
        reads.clear()
        batch = tier.get_many(_pairs(chain))
        assert next(batch)[0] == chain[0][1]
        batch.close()
        tier.close()  # waits for reads already started
        assert 1 <= len(reads) < 40  # read ahead a few files, not the whole chain
        assert tier.stats().hits == 1
        assert len(list(tier.get_many(_pairs(chain)))) == 40  # a closed tier reads again
    assert_cache_invariants(tmp_path)


def test_budget_10mb_of_50mb_written_lru_victims(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 200, kv_bytes=62_500)  # ~250 KB a file, 50 MB in all
    size = len(chain[0][2])
    budget = 10 * 10**6
    store = MeteredStore(tmp_path)
    pinned = frozenset({chain[0][0].key})
    with cold_tier(tmp_path, ns, max_bytes=budget, store=store, pinned=pinned) as (
        tier,
        writer,
        index,
        clock,
    ):
        for i, (meta, tokens, data) in enumerate(chain):
            clock.advance(1)
            tier.put(meta, tokens, data)
            _drain(writer)
            if i >= 20 and i % 10 == 0:
                # Keep block 5 hot: every read makes it young again, so it is never a victim.
                assert tier.get(chain[5][0].key, chain[5][0].parent_key) is not None
                _drain_recency(tier)
        assert store.peak <= budget + size
        assert writer.stats().written_bytes >= 50 * 10**6 * 0.99
        kept = set(index.get_blocks([m.key for m, _, _ in chain]))
        assert chain[0][0].key in kept and chain[5][0].key in kept  # pinned; recently read
        others = sorted(i for i, (m, _, _) in enumerate(chain) if m.key in kept and i not in (0, 5))
        assert others == list(range(200 - len(others), 200))  # the newest survive, LRU went first
        assert writer.stats().evicted_blocks == 200 - len(kept)
    assert_cache_invariants(tmp_path, budget)


def _drain_recency(tier: ColdTier) -> None:
    deadline = time.monotonic() + 5
    while tier.recency.pending() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_budget_and_lru_order_hold_across_a_restart(tmp_path: Path) -> None:
    """Recency recorded before a restart decides the victims after it."""
    ns = make_namespace()
    chain = make_chain(ns, 60, kv_bytes=62_500)  # 15 MB against a 10 MB budget
    size = len(chain[0][2])
    budget = 10 * 10**6
    clock = FakeClock()
    with cold_tier(tmp_path, ns, max_bytes=budget, clock=clock) as (tier, writer, _, _):
        for meta, tokens, data in chain[:30]:
            clock.advance(1)
            tier.put(meta, tokens, data)
            _drain(writer)
        clock.advance(1)
        assert tier.get(chain[2][0].key, chain[2][0].parent_key) is not None  # block 2 is now young
    # A new process on the same folder: the index, not memory, knows block 2 was used last.
    store = MeteredStore(tmp_path)
    store.on_disk = store.peak = sum(
        (store.file_info(rel) or (0, 0))[0] for rel in store.iter_relpaths()
    )
    with cold_tier(tmp_path, ns, max_bytes=budget, store=store, clock=clock) as (
        tier,
        writer,
        index,
        _,
    ):
        for meta, tokens, data in chain[30:]:
            clock.advance(1)
            tier.put(meta, tokens, data)
            _drain(writer)
        kept = set(index.get_blocks([m.key for m, _, _ in chain]))
    assert store.peak <= budget + size
    assert chain[2][0].key in kept
    others = sorted(i for i, (m, _, _) in enumerate(chain) if m.key in kept and i != 2)
    assert len(kept) < 60 and others == list(range(60 - len(others), 60))  # the older went first
    assert_cache_invariants(tmp_path, budget)


def _partial(ns: NamespaceInfo, parent: str, tokens: tuple[int, ...], kv_bytes: int = 256):
    """A request's trailing partial block (fewer tokens than the block size), as a file."""
    meta = BlockMeta(block_key(parent, tokens), parent, ns.digest, len(tokens))
    layers = [
        (RawTensor("BF16", (kv_bytes // 2,), bytes(kv_bytes)),) * 2 for _ in range(ns.layer_count)
    ]
    return meta, tokens, pack_block(meta, tokens, layers)


def test_partial_blocks_are_listed_as_children_and_served_verified(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 2)
    root = chain[0][0].key
    partials = [_partial(ns, root, (7,)), _partial(ns, root, (7, 8, 9))]
    with cold_tier(tmp_path, ns) as (tier, writer, index, clock):
        for meta, tokens, data in [*chain, *partials]:
            clock.advance(1)
            tier.put(meta, tokens, data)
            _drain(writer)
        children = tier.children(root)
        assert [c.key for c in children] == [p[0].key for p in reversed(partials)] + [
            chain[1][0].key
        ]  # most recently used first
        assert children[0] == partials[1][0]  # the metadata the prefix cache needs
        assert tier.children(ns.digest) == [chain[0][0]]
        assert tier.get(partials[1][0].key, root) == ((7, 8, 9), ns.layer_count)
        # A foreign namespace's rows are not offered.
        other = make_namespace("other")
        index.upsert_namespace(other)
        assert (
            ColdTier(
                other, FileBlockStore(tmp_path), index, writer, fake_decode, check=no_model_check
            ).children(root)
            == []
        )
        # Forged tokens under a partial key are caught by the rehash, then dropped.
        forged = _partial(ns, root, (7, 8, 10))[2]
        row = index.get_blocks([partials[0][0].key])[partials[0][0].key]
        FileBlockStore(tmp_path).write(row.relpath, forged)
        index.remove_blocks([row.key])
        index.add_block(replace(row, nbytes=len(forged), checksum=sha256(forged).hexdigest()))
        assert tier.get(row.key, root) is None
        assert row.key not in {c.key for c in tier.children(root)}
    assert_cache_invariants(tmp_path)


def test_an_old_conversation_is_found_among_many_newer_siblings(tmp_path: Path) -> None:
    """A short replay after a restart: its block is older than 30 siblings sharing 24 tokens."""
    ns = make_namespace()
    chain = make_chain(ns, 1)
    root = chain[0][0].key
    template = tuple(range(100, 124))
    old = _partial(ns, root, (*template, *range(7000, 7012)))
    newer = [_partial(ns, root, (*template, 9000 + i, 5)) for i in range(30)]
    want = (*template, *range(7000, 7011))  # the replayed prompt, one token left to prefill
    with cold_tier(tmp_path, ns) as (tier, writer, _, clock):
        for meta, tokens, data in [*chain, old, *newer]:
            clock.advance(1)
            tier.put(meta, tokens, data)
            _drain(writer)
        assert old[0].key not in {c.key for c in tier.children(root)}  # by recency alone
        match = best_child(
            want, [], lambda: tier.children(root, want), lambda m: tier.get(m.key, root)
        )
        assert match is not None and match.meta.key == old[0].key
        assert match.shared == len(want) and match.tokens == old[1]
    assert_cache_invariants(tmp_path)


def test_partial_blocks_count_against_the_budget(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 30, kv_bytes=62_500)
    size = len(chain[0][2])
    budget = 10 * size
    blocks = []
    for meta, tokens, data in chain:  # each full block followed by a partial sibling
        blocks.append((meta, tokens, data))
        blocks.append(_partial(ns, meta.parent_key, tokens[:2], kv_bytes=62_500))
    store = MeteredStore(tmp_path)
    with cold_tier(tmp_path, ns, max_bytes=budget, store=store) as (tier, writer, index, clock):
        for meta, tokens, data in blocks:
            clock.advance(1)
            tier.put(meta, tokens, data)
            _drain(writer)
        kept = index.get_blocks([m.key for m, _, _ in blocks])
        assert any(b.token_count < ns.block_size for b in kept.values())
        assert blocks[0][0].key not in kept and blocks[1][0].key not in kept  # LRU went first
    assert store.peak <= budget + size
    assert_cache_invariants(tmp_path, budget)
