"""The cold tier's write policy (``ColdWrites``) over the fakes of its ports: no files, no database.

Each test drives the policy the way the block writer's thread does (admit, write the
file, record) and ends with the storage invariant: rows <=> complete files, usage within
the budget.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import logging
from dataclasses import replace

import pytest

from omlx.adapters.blockfiles.budget import DiskBudget
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_writes import ColdWrites, WriteOutcome, WriterStats
from omlx.domain.cache.keys import block_key, namespace_digest
from omlx.domain.cache.ports import ByteBudget, IndexUnavailable
from omlx.domain.cache.tally import Tally
from tests.fakes import FakeBlockIndex, FakeBlockStore, FakeByteBudget, FakeClock

SIZE = 100  # bytes of every block file here
NS = NamespaceInfo(namespace_digest({"m": "tiny"}), "tiny", "/m/tiny", 4, "f32", 2)

Block = tuple[BlockMeta, bytes]


def _chain(n: int, seed: int = 0) -> list[Block]:
    parent, out = NS.digest, []
    for i in range(n):
        tokens = tuple(range(seed * 1000 + 4 * i, seed * 1000 + 4 * i + 4))
        meta = BlockMeta(block_key(parent, tokens), parent, NS.digest, 4, tokens=tokens)
        out.append((meta, _bytes(meta.key, seed)))
        parent = meta.key
    return out


def _bytes(key: str, seed: int = 0) -> bytes:
    return f"{key}:{seed}:".encode().ljust(SIZE, b".")


class Rig:
    """One server's policy over a store and an index (several rigs may share them)."""

    def __init__(
        self,
        store: FakeBlockStore,
        index: FakeBlockIndex,
        budget: FakeByteBudget,
        clock: FakeClock,
        **kw: object,
    ) -> None:
        self.store, self.index, self.budget, self.clock = store, index, budget, clock
        self.tally = Tally()
        self.writes = ColdWrites(store, index, budget, clock=clock, tally=self.tally, **kw)  # type: ignore[arg-type]

    def write(self, block: Block) -> WriteOutcome:
        """What the writer thread does per block: admit, write the file, record the row."""
        meta, data = block
        self.clock.advance()
        refused = self.writes.admit(meta, NS, len(data))
        if refused is not None:
            return refused
        return self.file(block)

    def file(self, block: Block) -> WriteOutcome:
        """The file, then the row: the half of ``write`` after admission."""
        meta, data = block
        checksum = hashlib.sha256(data).hexdigest()
        relpath = self.store.relpath(NS, meta.key, checksum)
        self.store.write(relpath, data)
        return self.writes.record(NS, meta, relpath, checksum, len(data))

    def stats(self) -> WriterStats:
        return self.tally.read_as(WriterStats)

    def kept(self, blocks: list[Block]) -> list[int]:
        return [i for i, (meta, _) in enumerate(blocks) if meta.key in self.index.blocks]


def _rig(max_blocks: int = 100, **kw: object) -> Rig:
    clock = FakeClock()
    return Rig(FakeBlockStore(), FakeBlockIndex(), FakeByteBudget(max_blocks * SIZE), clock, **kw)


def assert_invariant(store: FakeBlockStore, index: FakeBlockIndex, max_bytes: int) -> None:
    """Rows <=> complete files (size and checksum as recorded), usage within ``max_bytes``."""
    rows = {b.relpath: b for b in index.blocks.values()}
    assert set(rows) == set(store.files), "a row without its file, or a file without a row"
    for relpath, row in rows.items():
        data = store.files[relpath]
        assert len(data) == row.nbytes and hashlib.sha256(data).hexdigest() == row.checksum
    assert index.total_bytes() <= max_bytes


def test_the_file_comes_first_and_an_existing_key_is_skipped() -> None:
    rig = _rig()
    (block,) = _chain(1)
    assert rig.write(block) is WriteOutcome.WRITTEN
    row = rig.index.blocks[block[0].key]
    assert rig.store.files[row.relpath] == block[1]
    assert rig.index.heads[row.key] == block[0].tokens  # the index keeps them, to rank siblings
    assert rig.writes.admit(block[0], NS, SIZE) is WriteOutcome.EXISTING  # before any file
    assert len(rig.store.files) == 1
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_a_row_names_the_server_that_computed_its_block_and_first_writer_wins() -> None:
    a = _rig(shared=True)
    b = Rig(a.store, a.index, a.budget, a.clock, shared=True)
    (meta, data), (unnamed, data1) = _chain(2)
    assert a.write((replace(meta, computed_by="a"), data)) is WriteOutcome.WRITTEN
    assert b.file((replace(meta, computed_by="b"), data)) is WriteOutcome.LOST_RACE
    assert a.write((unnamed, data1)) is WriteOutcome.WRITTEN  # an import: nobody named
    assert [r.computed_by for r in a.index.blocks.values()] == ["a", None]
    assert_invariant(a.store, a.index, a.budget.max_bytes)


def test_the_budget_evicts_least_recently_used_first() -> None:
    rig = _rig(max_blocks=3)
    chain = _chain(5)
    for block in chain[:3]:
        assert rig.write(block) is WriteOutcome.WRITTEN
    rig.index.touch({chain[0][0].key: rig.clock.advance()})  # block 0 is used again
    for block in chain[3:]:
        assert rig.write(block) is WriteOutcome.WRITTEN
    assert rig.kept(chain) == [0, 3, 4]  # 1, then 2 went: the oldest use first
    assert (rig.stats().evicted_blocks, rig.stats().evicted_bytes) == (2, 2 * SIZE)
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_pinned_blocks_are_never_evicted() -> None:
    chain = _chain(6)
    pinned = {chain[0][0].key, chain[1][0].key}
    rig = _rig(max_blocks=3, is_pinned=pinned.__contains__)
    for block in chain:
        assert rig.write(block) is WriteOutcome.WRITTEN
    assert rig.kept(chain) == [0, 1, 5]
    pinned.add(chain[5][0].key)  # every block pinned: no room, the write is dropped
    assert rig.write(_chain(1, seed=7)[0]) is WriteOutcome.NO_ROOM
    assert rig.kept(chain) == [0, 1, 5] and len(rig.store.files) == 3
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_a_block_larger_than_the_budget_evicts_nothing() -> None:
    rig = _rig(max_blocks=2)
    chain = _chain(2)
    for block in chain:
        rig.write(block)
    meta, _ = _chain(1, seed=3)[0]
    assert rig.writes.admit(meta, NS, 3 * SIZE) is WriteOutcome.NO_ROOM
    assert rig.kept(chain) == [0, 1] and rig.stats().evicted_blocks == 0
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_a_shared_index_waits_for_another_servers_eviction_else_drops() -> None:
    rig = _rig(max_blocks=2, shared=True, eviction_wait=0.0)
    chain = _chain(3)
    for block in chain[:2]:
        rig.write(block)
    rig.index.evicting_elsewhere = True
    assert rig.write(chain[2]) is WriteOutcome.NO_ROOM
    assert rig.kept(chain) == [0, 1] and len(rig.store.files) == 2
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_a_shared_index_writes_once_the_other_servers_eviction_ends() -> None:
    class OtherEvicting(FakeBlockIndex):
        def evict(self, plan, accessed_before):
            victims = super().evict(plan, accessed_before)
            self.evicting_elsewhere = False  # the other server's transaction commits
            return victims

    clock = FakeClock()
    store, index = FakeBlockStore(), OtherEvicting()
    rig = Rig(store, index, FakeByteBudget(2 * SIZE), clock, shared=True, eviction_wait=5.0)
    chain = _chain(3)
    for block in chain[:2]:
        rig.write(block)
    index.evicting_elsewhere = True
    assert rig.write(chain[2]) is WriteOutcome.WRITTEN
    assert rig.kept(chain) == [1, 2] and rig.stats().evicted_blocks == 1
    assert_invariant(store, index, 2 * SIZE)


def test_the_lease_spares_blocks_any_server_used_recently() -> None:
    rig = _rig(max_blocks=2, shared=True, lease=3600.0)
    chain = _chain(4)
    outcomes = [rig.write(block) for block in chain]
    assert outcomes == [WriteOutcome.WRITTEN] * 2 + [WriteOutcome.NO_ROOM] * 2
    assert rig.stats().evicted_blocks == 0
    rig.clock.advance(7200)  # the lease ran out: LRU again
    assert rig.write(_chain(1, seed=5)[0]) is WriteOutcome.WRITTEN
    assert rig.kept(chain) == [1] and rig.stats().evicted_blocks == 1
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def _two_servers(**kw: object) -> tuple[Rig, Rig]:
    store, index, clock = FakeBlockStore(), FakeBlockIndex(), FakeClock()
    budget = FakeByteBudget(100 * SIZE)
    return (
        Rig(store, index, budget, clock, shared=True, **kw),
        Rig(store, index, budget, clock, shared=True, **kw),
    )


def test_the_first_writer_wins_and_the_loser_deletes_only_its_own_file() -> None:
    a, b = _two_servers()
    meta, data = _chain(1)[0]
    rival = (meta, _bytes(meta.key, seed=9))  # another batch's bytes for the same key
    assert b.writes.admit(meta, NS, SIZE) is None  # b was first to ask ...
    assert a.write((meta, data)) is WriteOutcome.WRITTEN  # ... a first to record: a wins
    assert b.file(rival) is WriteOutcome.LOST_RACE
    row = a.index.blocks[meta.key]
    assert list(a.store.files) == [row.relpath] and a.store.files[row.relpath] == data
    assert_invariant(a.store, a.index, a.budget.max_bytes)


def test_a_lost_race_over_the_same_bytes_keeps_the_winners_file() -> None:
    a, b = _two_servers()
    block = _chain(1)[0]
    assert a.writes.admit(block[0], NS, SIZE) is None
    assert b.writes.admit(block[0], NS, SIZE) is None
    assert a.file(block) is WriteOutcome.WRITTEN
    assert b.file(block) is WriteOutcome.LOST_RACE  # one content-addressed file: the row's
    assert len(a.store.files) == 1
    assert_invariant(a.store, a.index, a.budget.max_bytes)


@pytest.mark.parametrize(("lease", "outcome"), [(3600.0, "undone"), (0.0, "evicted")])
def test_a_shared_overshoot_is_evicted_or_undone(lease: float, outcome: str) -> None:
    a, b = _two_servers(lease=lease)
    a.budget.max_bytes = 3 * SIZE
    chain = _chain(4)
    for block in chain[:2]:
        assert a.write(block) is WriteOutcome.WRITTEN
    assert a.writes.admit(chain[2][0], NS, SIZE) is None  # 2 + 1 fit ...
    assert b.write(chain[3]) is WriteOutcome.WRITTEN  # ... and so did b's, at the same time
    a.clock.advance()
    if outcome == "undone":  # every block young: ours goes, row first, then its file
        assert a.file(chain[2]) is WriteOutcome.NO_ROOM
        assert a.kept(chain) == [0, 1, 3]
    else:
        assert a.file(chain[2]) is WriteOutcome.WRITTEN
        assert a.kept(chain) == [1, 2, 3] and a.stats().evicted_blocks == 1
    assert_invariant(a.store, a.index, 3 * SIZE)


def test_a_dropped_namespace_is_recorded_again(caplog: pytest.LogCaptureFixture) -> None:
    rig = _rig()
    chain = _chain(2)
    assert rig.write(chain[0]) is WriteOutcome.WRITTEN
    rig.index.blocks.clear()  # an admin's cache clear: the blocks, then the namespace row
    rig.store.files.clear()
    rig.index.namespaces.clear()
    with caplog.at_level(logging.INFO, logger="omlx"):
        assert rig.write(chain[1]) is WriteOutcome.WRITTEN
    assert NS.digest in rig.index.namespaces
    assert "re-recording namespace" in caplog.text
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_a_failed_row_removes_its_file_and_a_disk_fault_is_not_retried() -> None:
    full = OSError(errno.ENOSPC, "database or disk is full")
    rig = _rig(disk_fault=lambda exc: exc is full)
    chain = _chain(3)
    calls = []

    def add_block(block, tokens=(), image=None):
        calls.append(block.key)
        raise full

    real_add, rig.index.add_block = rig.index.add_block, add_block
    with pytest.raises(OSError):
        rig.write(chain[0])
    assert calls == [chain[0][0].key] and rig.store.files == {}  # once; no row, no file
    rig.index.add_block = real_add
    rig.index.down = True  # an unreachable index: the same, no retry
    with pytest.raises(IndexUnavailable):
        rig.file(chain[1])
    rig.index.down = False
    assert rig.store.files == {}
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_a_file_the_folder_refuses_to_delete_is_removed_after_the_next_write() -> None:
    rig = _rig(disk_fault=lambda exc: True)
    chain = _chain(2)
    rig.index.down = True
    rig.store.fail_deletes = OSError(errno.EROFS, "Read-only file system")
    with pytest.raises(IndexUnavailable):
        rig.file(chain[0])
    assert len(rig.store.files) == 1  # stranded for now
    rig.index.down = False
    rig.store.fail_deletes = None
    assert rig.write(chain[1]) is WriteOutcome.WRITTEN
    assert rig.kept(chain) == [1]
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def test_forget_usage_reads_the_total_again() -> None:
    rig = _rig(max_blocks=2)
    chain = _chain(3)
    for block in chain[:2]:
        rig.write(block)
    rig.index.remove_blocks([chain[0][0].key])  # another tool removed a block
    rig.store.delete(rig.store.relpath(NS, chain[0][0].key, _sha(chain[0][1])))
    rig.writes.forget_usage()
    assert rig.write(chain[2]) is WriteOutcome.WRITTEN
    assert rig.stats().evicted_blocks == 0 and rig.budget.asked[-1] == SIZE
    assert_invariant(rig.store, rig.index, rig.budget.max_bytes)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_disk_budget_is_a_byte_budget() -> None:
    want = list(inspect.signature(ByteBudget.limit).parameters)
    assert list(inspect.signature(DiskBudget.limit).parameters) == want
