"""Two block writers on one folder and one PostgreSQL index: what two servers' writer threads do.

Real files, a real PostgreSQL server, two writers with their own stores and index
connections, as two processes have. Each test ends with the invariant: rows <=> files,
usage within the shared budget.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from omlx.adapters.blockfiles.budget import DiskBudget
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.blockfiles.writer import BlockWriter
from omlx.adapters.sqlindex import SqlBlockIndex, connect_index
from omlx.domain.cache.blocks import BlockMeta
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace

BIG = 10**12


class GatedStore(FileBlockStore):
    """Holds every write at a barrier, so two writers reach the index at the same moment."""

    def __init__(self, root: Path, barrier: threading.Barrier, writer_id: str) -> None:
        super().__init__(root, writer_id=writer_id)
        self.barrier = barrier

    def write(self, relpath: str, data: bytes) -> None:
        super().write(relpath, data)
        self.barrier.wait(10)


def _writer(
    tmp_path: Path, url: str, name: str, *, max_bytes: int = BIG, lease: float = 0.0, store=None
) -> tuple[BlockWriter, SqlBlockIndex]:
    index = connect_index(url, host=name)
    writer = BlockWriter(
        store or FileBlockStore(tmp_path, writer_id=name),
        index,
        DiskBudget(tmp_path, max_bytes=max_bytes, reserve_bytes=0),
        shared=True,
        lease=lease,
    )
    return writer, index


def _wait(writer: BlockWriter) -> None:
    deadline = time.monotonic() + 20
    while writer.pending_keys() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not writer.pending_keys()


def test_one_key_written_by_two_servers_at_once_leaves_one_row_one_file(
    tmp_path: Path, pg_url: str
) -> None:
    ns = make_namespace()
    (meta, _, data), (_, _, other) = make_chain(ns, 2)
    barrier = threading.Barrier(2)
    a, ia = _writer(tmp_path, pg_url, "a", store=GatedStore(tmp_path, barrier, "a"))
    b, ib = _writer(tmp_path, pg_url, "b", store=GatedStore(tmp_path, barrier, "b"))
    # Two servers' bytes for one key may differ (another batch, another kernel): the key
    # is the same, the files are two, and the loser must delete only its own.
    rival = BlockMeta(meta.key, meta.parent_key, meta.namespace, meta.token_count)
    assert a.submit(meta, ns, data) and b.submit(rival, ns, other)
    _wait(a)
    _wait(b)
    stats = [a.stats(), b.stats()]
    assert sorted(s.written for s in stats) == [0, 1], stats
    assert sorted(s.lost_races for s in stats) == [0, 1]
    row = ia.get_blocks([meta.key])[meta.key]
    assert row.checksum in {__import__("hashlib").sha256(d).hexdigest() for d in (data, other)}
    assert len(list(FileBlockStore(tmp_path).iter_relpaths())) == 1
    # The same bytes from both: one file, which the loser must not delete.
    (meta2, _, data2) = make_chain(ns, 1, seed=3)[0]
    assert a.submit(meta2, ns, data2) and b.submit(meta2, ns, data2)
    _wait(a)
    _wait(b)
    assert FileBlockStore(tmp_path).file_info(ib.get_blocks([meta2.key])[meta2.key].relpath)
    for w, i in ((a, ia), (b, ib)):
        assert w.close(timeout=10)
        i.close()
    assert_cache_invariants(tmp_path, index_url=pg_url)


def test_a_tiny_shared_budget_holds_across_two_writers(tmp_path: Path, pg_url: str) -> None:
    ns = make_namespace()
    chains = [make_chain(ns, 40, kv_bytes=4096, seed=s) for s in (1, 2)]
    size = len(chains[0][0][2])
    budget = 6 * size
    writers = [_writer(tmp_path, pg_url, name, max_bytes=budget) for name in ("a", "b")]
    peak = 0

    def feed(writer: BlockWriter, chain) -> None:
        for meta, _, data in chain:
            writer.submit(meta, ns, data)
            _wait(writer)

    threads = [
        threading.Thread(target=feed, args=(w, c))
        for (w, _), c in zip(writers, chains, strict=True)
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, writers[0][1].total_bytes())
        time.sleep(0.005)
    for t in threads:
        t.join()
    stats = [w.stats() for w, _ in writers]
    assert sum(s.written for s in stats) >= 40  # both wrote, by turns
    assert sum(s.evicted_blocks for s in stats) >= 70
    assert peak <= budget + 2 * size  # at most one block in flight per writer beyond it
    for w, i in writers:
        assert w.close(timeout=10)
        i.close()
    assert_cache_invariants(tmp_path, budget, index_url=pg_url)


def test_the_lease_keeps_young_blocks_and_drops_the_write_instead(
    tmp_path: Path, pg_url: str
) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 10, kv_bytes=4096)
    size = len(chain[0][2])
    budget = 4 * size
    a, ia = _writer(tmp_path, pg_url, "a", max_bytes=budget, lease=3600)
    for meta, _, data in chain:
        a.submit(meta, ns, data)
        _wait(a)
    stats = a.stats()
    assert stats.written == 4 and stats.dropped_no_space == 6 and stats.evicted_blocks == 0
    assert set(ia.get_blocks([m.key for m, _, _ in chain])) == {m.key for m, _, _ in chain[:4]}
    assert a.close(timeout=10)
    ia.close()
    assert_cache_invariants(tmp_path, budget, index_url=pg_url)


def test_an_unreachable_index_drops_writes_and_leaves_no_file(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    index = connect_index(f"postgresql+psycopg://omlx@127.0.0.1:{port}/omlx", migrate=False)
    writer = BlockWriter(FileBlockStore(tmp_path), index, DiskBudget(tmp_path, BIG, 0), shared=True)
    ns = make_namespace()
    for meta, _, data in make_chain(ns, 3):
        assert writer.submit(meta, ns, data)
    assert writer.close(timeout=10)
    assert writer.stats().dropped_index_unavailable == 3
    assert list(FileBlockStore(tmp_path).iter_relpaths()) == []
    assert list(FileBlockStore(tmp_path).iter_temp_files()) == []
    index.close()
