"""The block writer thread: drain on close, drops (queue full, ENOSPC), budget and reserve."""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import namedtuple
from pathlib import Path

import pytest

from omlx.adapters.blockfiles.budget import DiskBudget, default_reserve
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.blockfiles.writer import BlockWriter
from omlx.adapters.sqlindex import SqlBlockIndex, open_index
from omlx.domain.cache.cold_tier import RecencyBuffer
from tests.storage_checks import (
    assert_cache_invariants,
    block_files_bytes,
    make_chain,
    make_namespace,
)

DiskUsage = namedtuple("DiskUsage", "total used free")
BIG = 10**12


class SlowStore(FileBlockStore):
    """A real store whose writes can be held at a gate, slowed down, or fail."""

    def __init__(self, root: Path, delay: float = 0.0) -> None:
        super().__init__(root)
        self.delay = delay
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: OSError | None = None

    def write(self, relpath: str, data: bytes) -> None:
        self.entered.set()
        self.gate.wait(10)
        time.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        super().write(relpath, data)


def _writer(
    tmp_path: Path, store: FileBlockStore | None = None, **kw: object
) -> tuple[BlockWriter, SqlBlockIndex]:
    index = open_index(tmp_path)
    budget = kw.pop("budget", DiskBudget(tmp_path, max_bytes=BIG, reserve_bytes=0))
    writer = BlockWriter(store or FileBlockStore(tmp_path), index, budget, **kw)  # type: ignore[arg-type]
    return writer, index


def test_close_drains_the_queue(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 40)
    writer, index = _writer(tmp_path, SlowStore(tmp_path, delay=0.002), queue_size=64)
    assert all(writer.submit(meta, ns, data) for meta, _, data in chain)
    assert writer.pending(chain[-1][0].key)
    assert writer.close(timeout=20)
    assert writer.pending_keys() == frozenset()
    stats = writer.stats()
    assert stats.written == 40 and stats.written_bytes == sum(len(d) for _, _, d in chain)
    assert stats.write_seconds > 0
    assert set(index.get_blocks([m.key for m, _, _ in chain])) == {m.key for m, _, _ in chain}
    meta, _, data = make_chain(ns, 1, seed=5)[0]
    assert not writer.has_room()
    assert writer.submit(meta, ns, data) is False  # closed: dropped, counted
    assert writer.stats().dropped_closed == 1
    index.close()
    assert_cache_invariants(tmp_path)


def test_full_queue_drops_without_blocking(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 5)
    store = SlowStore(tmp_path)
    store.gate.clear()
    writer, index = _writer(tmp_path, store, queue_size=2)
    assert writer.submit(chain[0][0], ns, chain[0][2])
    assert store.entered.wait(5)  # the thread holds job 0; the queue is empty again
    assert writer.submit(chain[1][0], ns, chain[1][2])
    assert writer.submit(chain[2][0], ns, chain[2][2])
    assert writer.submit(chain[1][0], ns, chain[1][2])  # already queued: accepted once, not twice
    assert not writer.has_room()  # what the keeper asks before it queues (it defers instead)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        assert writer.submit(chain[3][0], ns, chain[3][2]) is False
    assert time.monotonic() - started < 0.1
    assert "queue is full" in caplog.text
    assert writer.pending_keys() == {chain[i][0].key for i in range(3)}
    store.gate.set()
    assert writer.close(timeout=10)
    stats = writer.stats()
    assert stats.dropped_queue_full == 1 and stats.written == 3
    index.close()
    assert_cache_invariants(tmp_path)


def test_once_the_server_stops_a_full_queue_is_waited_for_not_dropped(tmp_path: Path) -> None:
    """The stop's last blocks (the generations it cut) are written, however many at once."""
    ns = make_namespace()
    chain = make_chain(ns, 6)
    store = SlowStore(tmp_path, delay=0.01)
    store.gate.clear()
    writer, index = _writer(tmp_path, store, queue_size=2)
    writer.wait_for_room(5.0)
    assert writer.has_room()  # a full queue is waited for now: the keeper's deferred go too
    threading.Timer(0.2, store.gate.set).start()  # the disk catches up
    started = time.monotonic()
    assert all(writer.submit(meta, ns, data) for meta, _, data in chain)
    assert time.monotonic() - started >= 0.15  # it waited for room rather than dropping
    assert writer.close(timeout=10)
    assert writer.stats().written == 6 and writer.stats().dropped_queue_full == 0
    index.close()
    assert_cache_invariants(tmp_path)


def test_enospc_drops_the_write(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 3)
    store = SlowStore(tmp_path)
    store.fail = OSError(errno.ENOSPC, "No space left on device")
    writer, index = _writer(tmp_path, store)
    with caplog.at_level(logging.WARNING):
        assert writer.submit(chain[0][0], ns, chain[0][2])  # accepted; the disk drops it later
        deadline = time.monotonic() + 5
        while writer.pending(chain[0][0].key) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "ENOSPC" in caplog.text
    store.fail = None
    writer.submit(chain[1][0], ns, chain[1][2])
    assert writer.close(timeout=10)
    stats = writer.stats()
    assert stats.dropped_no_space == 1 and stats.written == 1
    assert index.get_blocks([chain[0][0].key]) == {}
    index.close()
    assert_cache_invariants(tmp_path)


def test_real_enospc_removes_the_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = make_namespace()
    ((meta, _, data),) = make_chain(ns, 1)
    writer, index = _writer(tmp_path)

    def full_disk(fd: int, view: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("omlx.adapters.blockfiles.store.os.write", full_disk)
    writer.submit(meta, ns, data)
    assert writer.close(timeout=10)
    monkeypatch.undo()
    assert writer.stats().dropped_no_space == 1
    index.close()
    assert_cache_invariants(tmp_path)  # no row, no file, no temp file


def test_close_is_bounded_and_keeps_the_invariant(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 30)
    writer, index = _writer(tmp_path, SlowStore(tmp_path, delay=0.05), queue_size=64)
    for meta, _, data in chain:
        writer.submit(meta, ns, data)
    started = time.monotonic()
    assert writer.close(timeout=0.3) is False
    assert time.monotonic() - started < 2.0
    stats = writer.stats()
    assert stats.written + stats.dropped_closed == 30 and stats.dropped_closed > 0
    assert writer.pending_keys() == frozenset()
    index.close()
    assert_cache_invariants(tmp_path)


def test_budget_evicts_lru_first_and_never_pinned(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 20, kv_bytes=1024)
    size = len(chain[0][2])
    pinned = {chain[0][0].key, chain[1][0].key}
    budget = DiskBudget(tmp_path, max_bytes=6 * size, reserve_bytes=0)
    clock = iter(range(1, 1000))
    writer, index = _writer(
        tmp_path, budget=budget, is_pinned=pinned.__contains__, clock=lambda: float(next(clock))
    )
    for meta, _, data in chain:
        writer.submit(meta, ns, data)
    assert writer.close(timeout=20)
    kept = {m.key for m, _, _ in chain} & set(index.get_blocks([m.key for m, _, _ in chain]))
    assert pinned <= kept
    assert kept - pinned == {m.key for m, _, _ in chain[-4:]}  # the newest four, LRU went first
    assert writer.stats().evicted_blocks == 14
    index.close()
    assert_cache_invariants(tmp_path, 6 * size)


def test_free_space_reserve_is_kept(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 30, kv_bytes=1024)
    size = len(chain[0][2])
    capacity, reserve = 12 * size, 3 * size
    low_water: list[int] = []

    def disk_usage(path: object) -> DiskUsage:
        free = capacity - block_files_bytes(tmp_path)  # a small disk holding only the cache
        low_water.append(free)
        return DiskUsage(capacity, capacity - free, free)

    budget = DiskBudget(tmp_path, max_bytes=BIG, reserve_bytes=reserve, disk_usage=disk_usage)
    writer, index = _writer(tmp_path, budget=budget)
    for meta, _, data in chain:
        writer.submit(meta, ns, data)
    assert writer.close(timeout=20)
    assert capacity - block_files_bytes(tmp_path) >= reserve
    assert min(low_water) >= reserve  # seen before every write: never under the reserve
    assert index.block_count() == 9
    index.close()
    assert_cache_invariants(tmp_path, capacity - reserve)


def test_default_reserve() -> None:
    assert default_reserve(10 * 2**30) == int(10 * 2**30 * 0.05)  # small disk: 5%
    assert default_reserve(2 * 10**12) == 2**30  # large disk: 1 GiB


def test_tick_flushes_recency_on_the_writer_thread(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 2)
    index = open_index(tmp_path)
    recency = RecencyBuffer(index, interval=0.0)
    writer = BlockWriter(
        FileBlockStore(tmp_path),
        index,
        DiskBudget(tmp_path, BIG, 0),
        tick=recency.maybe_flush,
        tick_interval=0.02,
    )
    for meta, _, data in chain:
        writer.submit(meta, ns, data)
    deadline = time.monotonic() + 5
    while writer.pending_keys() and time.monotonic() < deadline:
        time.sleep(0.01)
    recency.record([chain[0][0].key])
    while recency.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert index.get_blocks([chain[0][0].key])[chain[0][0].key].hit_count == 1
    assert writer.close(timeout=5)
    index.close()
    assert_cache_invariants(tmp_path)


@pytest.mark.parametrize(
    ("error", "reason", "said"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no_space", "out of space (ENOSPC"),
        (
            OSError(errno.EROFS, "Read-only file system"),
            "read_only",
            "read-only or not writable (EROFS",
        ),
        (PermissionError(errno.EACCES, "Permission denied"), "read_only", "not writable (EACCES"),
    ],
    ids=["full", "read-only", "permission"],
)
def test_a_disk_fault_is_one_warning_per_episode_and_one_recovery_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, error: OSError, reason: str, said: str
) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 25)
    store = SlowStore(tmp_path)
    store.fail = error
    writer, index = _writer(tmp_path, store)
    with caplog.at_level(logging.DEBUG, logger="omlx"):
        for meta, _, data in chain[:20]:
            writer.submit(meta, ns, data)
        deadline = time.monotonic() + 10
        while writer.pending_keys() and time.monotonic() < deadline:
            time.sleep(0.01)
        store.fail = None
        for meta, _, data in chain[20:]:
            writer.submit(meta, ns, data)
        assert writer.close(timeout=10)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, [r.getMessage() for r in warnings]
    assert said in warnings[0].getMessage() and str(tmp_path) in warnings[0].getMessage()
    assert "written again (20 writes dropped" in warnings[1].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # no traceback
    stats = writer.stats()
    assert (
        getattr(stats, f"dropped_{reason}") == 20
        and stats.written == 5
        and stats.dropped_error == 0
    )
    index.close()
    assert_cache_invariants(tmp_path)


def test_a_full_index_database_is_the_same_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite's own 'database or disk is full' (the row after the file) is no_space too."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    ns = make_namespace()
    chain = make_chain(ns, 6)
    writer, index = _writer(tmp_path)
    real_add = index.add_block
    full = OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))

    def add_block(block, tokens=(), image=None):
        raise full

    index.add_block = add_block
    with caplog.at_level(logging.WARNING, logger="omlx"):
        for meta, _, data in chain[:4]:
            writer.submit(meta, ns, data)
        deadline = time.monotonic() + 10
        while writer.pending_keys() and time.monotonic() < deadline:
            time.sleep(0.01)
        index.add_block = real_add
        for meta, _, data in chain[4:]:
            writer.submit(meta, ns, data)
        assert writer.close(timeout=10)
    # Only warnings count: the index's creation is an INFO line of the set-up.
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2 and "out of space (database or disk is full)" in lines[0], lines
    assert writer.stats().dropped_no_space == 4 and writer.stats().written == 2
    index.close()
    assert_cache_invariants(tmp_path)  # the files of the failed rows were removed
