"""The index repository on both backends: CRUD, recency across re-open, views, eviction.

Every test of the repository runs against SQLite and against a real PostgreSQL server
(the ``index_url`` fixture); the pragma and transaction-mode checks are per dialect.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError

from omlx.adapters.blockfiles.format import pack_block
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex import (
    SqlBlockIndex,
    connect_index,
    index_path,
    make_engine,
    open_index,
)
from omlx.adapters.sqlindex.postgres import EVICTION_LOCK, lock_key
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo, StoredBlock
from omlx.domain.cache.cold_tier import RecencyBuffer
from omlx.domain.cache.keys import block_key
from omlx.domain.cache.ports import IndexUnavailable
from tests.fakes import FakeClock
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace, record_block


def _put(
    tmp_path: Path,
    index: SqlBlockIndex,
    ns: NamespaceInfo,
    meta: BlockMeta,
    data: bytes,
    at: float = 1.0,
) -> StoredBlock:
    """File first, row second: the way the writer records a block."""
    return record_block(FileBlockStore(tmp_path), index, ns, meta, data, at)


def test_pragmas_on_every_connection(tmp_path: Path) -> None:
    engine = make_engine(index_path(tmp_path))
    seen: list[tuple[object, ...]] = []

    def check() -> None:
        with engine.connect() as conn:
            seen.append(
                tuple(
                    conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                    for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
                )
            )

    held = [engine.connect() for _ in range(3)]  # force distinct pooled connections
    threads = [threading.Thread(target=check) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check()
    for conn in held:
        seen.append(
            tuple(
                conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                for p in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
            )
        )
        conn.close()
    assert len(seen) == 7
    assert set(seen) == {("wal", 1, 1, 5000)}
    engine.dispose()


def test_writes_begin_immediate_reads_deferred(tmp_path: Path) -> None:
    index = open_index(tmp_path)
    statements: list[str] = []
    event.listen(
        index.engine, "before_cursor_execute", lambda conn, cur, stmt, *a: statements.append(stmt)
    )
    ns = make_namespace()
    index.upsert_namespace(ns)
    assert statements[0] == "BEGIN IMMEDIATE"
    statements.clear()
    index.lru_blocks(1)
    assert statements[0] == "BEGIN DEFERRED"
    index.close()


def test_crud(tmp_path: Path, index_url: str) -> None:
    clock = FakeClock(100.0)
    index = connect_index(index_url, clock=clock.now)
    ns, other = make_namespace(), make_namespace("other")
    index.upsert_namespace(ns)
    clock.advance(5)
    index.upsert_namespace(ns)  # idempotent; refreshes last use, keeps creation
    (rec,) = index.namespace_records()
    assert rec.info == ns and rec.created_at == 100.0 and rec.last_used_at == 105.0

    chain = make_chain(ns, 4)
    blocks = [_put(tmp_path, index, ns, m, d, at=float(i)) for i, (m, _, d) in enumerate(chain)]
    index.add_block(blocks[0])  # idempotent
    assert index.get_blocks([b.key for b in blocks] + ["ff" * 32]) == {b.key: b for b in blocks}
    assert index.total_bytes() == sum(b.nbytes for b in blocks)
    assert index.all_relpaths() == {b.relpath for b in blocks}
    assert [b.key for b in index.lru_blocks(2)] == [blocks[0].key, blocks[1].key]
    assert [b.key for b in index.iter_blocks(page=3)] == sorted(b.key for b in blocks)

    with pytest.raises(IntegrityError):  # foreign keys are on
        index.add_block(StoredBlock("ee" * 32, other.digest, other.digest, 4, 1, "0", "x", 1, 1))

    index.remove_blocks([blocks[0].key])
    FileBlockStore(tmp_path).delete(blocks[0].relpath)  # row first, file second
    assert index.block_count() == 3

    index.weight_digest_store("/m/model.safetensors", 10, 1.5, "d1")
    assert index.weight_digest_lookup("/m/model.safetensors", 10, 1.5) == "d1"
    assert index.weight_digest_lookup("/m/model.safetensors", 11, 1.5) is None  # changed file
    index.weight_digest_store("/m/model.safetensors", 11, 2.5, "d2")
    assert index.weight_digest_lookup("/m/model.safetensors", 11, 2.5) == "d2"
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_children_by_parent_key_most_recent_first(tmp_path: Path, index_url: str) -> None:
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    chain = make_chain(ns, 2)
    root = _put(tmp_path, index, ns, chain[0][0], chain[0][2], at=1.0)
    _put(tmp_path, index, ns, chain[1][0], chain[1][2], at=2.0)
    # Siblings of block 1: partial blocks of other requests (1 to 3 tokens).
    siblings = []
    for n, at in ((1, 5.0), (3, 3.0), (2, 4.0)):
        tokens = tuple(range(900 + n, 900 + 2 * n))
        meta = BlockMeta(block_key(root.key, tokens), root.key, ns.digest, n)
        siblings.append(_put(tmp_path, index, ns, meta, pack_block(meta, tokens, []), at=at))
    found = index.children(root.key, 10)
    assert [b.key for b in found] == [
        siblings[0].key,
        siblings[2].key,
        siblings[1].key,
        chain[1][0].key,
    ]
    assert [b.token_count for b in found] == [1, 2, 3, 4]
    assert found[0] == siblings[0]  # whole rows
    assert [b.key for b in index.children(root.key, 2)] == [siblings[0].key, siblings[2].key]
    assert [b.key for b in index.children(ns.digest, 10)] == [root.key]
    assert index.children("ab" * 32, 10) == []
    with index.engine.connect() as conn:
        if index.shared:  # a table this small is scanned unless the planner must use an index
            conn.exec_driver_sql("SET enable_seqscan = off")
            explain = "EXPLAIN SELECT key FROM blocks WHERE parent_key = 'x'"
        else:
            explain = "EXPLAIN QUERY PLAN SELECT key FROM blocks WHERE parent_key = 'x'"
        plan = conn.exec_driver_sql(explain).fetchall()
    assert any("ix_blocks_parent_key_last_access" in str(row) for row in plan)
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_remove_namespace_cascades(tmp_path: Path, index_url: str) -> None:
    index = connect_index(index_url)
    ns, other = make_namespace(), make_namespace("other")
    for n in (ns, other):
        index.upsert_namespace(n)
        for meta, _, data in make_chain(n, 3):
            _put(tmp_path, index, n, meta, data)
    removed = index.remove_namespaces([ns.digest])
    assert {b.namespace for b in removed} == {ns.digest} and len(removed) == 3
    for block in removed:
        FileBlockStore(tmp_path).delete(block.relpath)
    assert {u.namespace for u in index.usage()} == {other.digest}
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_batched_touch_persists_lru_order_across_reopen(tmp_path: Path, index_url: str) -> None:
    clock = FakeClock(1000.0)
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    blocks = [
        _put(tmp_path, index, ns, m, d, at=float(i))
        for i, (m, _, d) in enumerate(make_chain(ns, 5))
    ]
    recency = RecencyBuffer(index, clock, interval=10.0)

    statements: list[str] = []
    event.listen(
        index.engine, "before_cursor_execute", lambda conn, cur, stmt, *a: statements.append(stmt)
    )
    for b in (blocks[0], blocks[2], blocks[0]):
        clock.advance(1)
        recency.record([b.key])
    assert recency.maybe_flush() == 0  # interval not reached: nothing written yet
    assert statements == [] and recency.pending() == 2
    clock.advance(10)
    assert recency.maybe_flush() == 2
    assert sum(s.startswith("UPDATE blocks") for s in statements) == 1  # one batched statement
    index.close()

    reopened = connect_index(index_url)
    order = [b.key for b in reopened.lru_blocks(10)]
    assert order == [blocks[1].key, blocks[3].key, blocks[4].key, blocks[2].key, blocks[0].key]
    rows = reopened.get_blocks([blocks[0].key, blocks[2].key])
    assert rows[blocks[0].key].last_access == 1003.0 and rows[blocks[0].key].hit_count == 1
    assert rows[blocks[2].key].last_access == 1002.0
    reopened.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_recency_buffer_flushes_when_full(tmp_path: Path, index_url: str) -> None:
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    blocks = [_put(tmp_path, index, ns, m, d) for m, _, d in make_chain(ns, 3)]
    recency = RecencyBuffer(index, FakeClock(50.0), max_pending=3)
    recency.record([blocks[0].key, blocks[1].key])
    assert recency.pending() == 2
    recency.record([blocks[2].key])
    assert recency.pending() == 0
    assert all(b.hit_count == 1 for b in index.get_blocks([b.key for b in blocks]).values())
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_views(tmp_path: Path, index_url: str) -> None:
    index = connect_index(index_url)
    ns, other, empty = make_namespace("alpha"), make_namespace("beta"), make_namespace("gamma")
    for n in (ns, other, empty):
        index.upsert_namespace(n)
    a = [
        _put(tmp_path, index, ns, m, d, at=10.0 + i)
        for i, (m, _, d) in enumerate(make_chain(ns, 3))
    ]
    b = [_put(tmp_path, index, other, m, d, at=5.0) for m, _, d in make_chain(other, 2, seed=1)]
    with index.engine.connect() as conn:
        usage = {r.model_name: r for r in conn.execute(text("SELECT * FROM cache_usage"))}
        lru = conn.execute(text("SELECT key, model_name, last_access_utc FROM lru_blocks")).all()
    assert usage["alpha"].blocks == 3 and usage["alpha"].nbytes == sum(x.nbytes for x in a)
    assert usage["alpha"].tokens == 3 * ns.block_size
    assert (usage["alpha"].oldest_access, usage["alpha"].newest_access) == (10.0, 12.0)
    assert usage["gamma"].blocks == 0 and usage["gamma"].nbytes == 0  # people see empty models too
    assert [r.key for r in lru] == sorted(x.key for x in b) + [x.key for x in a]
    assert lru[0].model_name == "beta" and lru[0].last_access_utc == "1970-01-01 00:00:05"
    port_usage = {u.model_name: u for u in index.usage()}
    assert set(port_usage) == {"alpha", "beta"} and port_usage["beta"].blocks == 2
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_concurrent_writers_and_readers(tmp_path: Path, index_url: str) -> None:
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    chains = [make_chain(ns, 40, kv_bytes=32, seed=s) for s in range(3)]
    errors: list[BaseException] = []

    def write(chain: list[tuple[BlockMeta, tuple[int, ...], bytes]]) -> None:
        try:
            for meta, _, data in chain:
                _put(tmp_path, index, ns, meta, data)
                index.touch({meta.key: 5.0})
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(200):
                index.get_blocks([m.key for m, _, _ in chains[0][:30]])
                index.lru_blocks(5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(c,)) for c in chains]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert index.block_count() == 120
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_first_writer_wins(tmp_path: Path, index_url: str) -> None:
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    (meta, _, data), (_, _, other_data) = make_chain(ns, 2)
    first = _put(tmp_path, index, ns, meta, data, at=1.0)
    assert index.add_block(replace(first, key="ab" * 32, parent_key=first.key)) is True
    index.remove_blocks(["ab" * 32])
    # A second writer's row for the same key (its own file, other bytes) changes nothing.
    rival = replace(
        first, nbytes=len(other_data), checksum="0" * 64, relpath="x/y/z", last_access=9.0
    )
    assert index.add_block(rival) is False
    assert index.get_blocks([meta.key]) == {meta.key: first}
    assert index.block_count() == 1
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_evict_plans_on_the_total_and_respects_the_lease(tmp_path: Path, index_url: str) -> None:
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    blocks = [
        _put(tmp_path, index, ns, m, d, at=float(i))
        for i, (m, _, d) in enumerate(make_chain(ns, 6))
    ]
    seen: list[tuple[int, list[str]]] = []

    def plan(total: int, oldest_first: Iterable[StoredBlock]) -> list[StoredBlock]:
        candidates = list(oldest_first)
        seen.append((total, [b.key for b in candidates]))
        return candidates[:2]

    # The lease: blocks used at or after t=4 are not offered.
    victims = index.evict(plan, accessed_before=4.0)
    assert seen == [(sum(b.nbytes for b in blocks), [b.key for b in blocks[:4]])]
    assert victims == blocks[:2]
    assert set(index.get_blocks([b.key for b in blocks])) == {b.key for b in blocks[2:]}
    for victim in victims:  # rows first, files after the commit
        FileBlockStore(tmp_path).delete(victim.relpath)
    assert index.evict(lambda total, rows: [], None) == []
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_host_rows_stay_per_host(tmp_path: Path, index_url: str) -> None:
    a = connect_index(index_url, host="host-a")
    b = connect_index(index_url, host="host-b", migrate=False)
    ns = make_namespace()
    a.upsert_namespace(ns)
    b.upsert_namespace(replace(ns, model_path="/elsewhere/model"))
    assert [r.info for r in a.namespace_records()] == [ns]  # b's path did not overwrite a's
    assert [r.info.model_path for r in b.namespace_records()] == ["/elsewhere/model"]
    c = connect_index(index_url, host="host-c", migrate=False)
    assert [r.info.model_path for r in c.namespace_records()] == [""]  # never used it
    a.weight_digest_store("/m/w.safetensors", 5_000_000_000, 1.5, "digest-a")  # > 2 GiB
    assert a.weight_digest_lookup("/m/w.safetensors", 5_000_000_000, 1.5) == "digest-a"
    assert b.weight_digest_lookup("/m/w.safetensors", 5_000_000_000, 1.5) is None
    assert a.remove_namespaces([ns.digest]) == []
    assert c.namespace_records() == []  # the host rows went with the namespace (cascade)
    for index in (a, b, c):
        index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


# --- PostgreSQL only: sessions, locks, an unreachable server ----------------------------


def test_postgres_sessions_have_bounded_waits(pg_url: str) -> None:
    index = connect_index(pg_url)
    with index.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "5s"
        assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "2s"
    assert index.shared and "@127.0.0.1" in index.label
    index.close()


def test_postgres_eviction_is_one_server_at_a_time(tmp_path: Path, pg_url: str) -> None:
    index = connect_index(pg_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    blocks = [_put(tmp_path, index, ns, m, d) for m, _, d in make_chain(ns, 3)]
    other = index.engine.connect()  # another server, in the middle of its eviction
    other.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_key(EVICTION_LOCK)})
    assert index.evict(lambda total, rows: list(rows), None) is None
    assert index.block_count() == 3  # nothing removed
    other.rollback()
    # Rows another transaction holds (a peer's eviction) are skipped, not waited on.
    other.execute(text("SELECT key FROM blocks WHERE key = :k FOR UPDATE"), {"k": blocks[0].key})
    victims = index.evict(lambda total, rows: list(rows), None)
    assert sorted(v.key for v in victims or []) == sorted(b.key for b in blocks[1:])
    other.rollback()
    other.close()
    for victim in victims or []:
        FileBlockStore(tmp_path).delete(victim.relpath)
    index.close()
    assert_cache_invariants(tmp_path, index_url=pg_url)


def test_postgres_touch_skips_rows_held_elsewhere(tmp_path: Path, pg_url: str) -> None:
    index = connect_index(pg_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    blocks = [_put(tmp_path, index, ns, m, d) for m, _, d in make_chain(ns, 3)]
    other = index.engine.connect()
    other.execute(text("SELECT key FROM blocks WHERE key = :k FOR UPDATE"), {"k": blocks[1].key})
    started = time.monotonic()
    index.touch({b.key: 50.0 for b in reversed(blocks)})  # recency is advisory: no waiting
    assert time.monotonic() - started < 1.5
    other.rollback()
    other.close()
    rows = index.get_blocks([b.key for b in blocks])
    assert [rows[b.key].hit_count for b in blocks] == [1, 0, 1]
    index.close()
    assert_cache_invariants(tmp_path, index_url=pg_url)


def test_unreachable_postgres_is_unavailable_fast() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    index = connect_index(f"postgresql+psycopg://omlx@127.0.0.1:{port}/omlx", migrate=False)
    with pytest.raises(IndexUnavailable, match="unreachable"):
        index.get_blocks(["ab" * 32])
    started = time.monotonic()
    for call in (
        lambda: index.get_blocks(["ab"]),
        lambda: index.touch({"ab": 1.0}),
        index.total_bytes,
    ):
        with pytest.raises(IndexUnavailable):
            call()
    assert time.monotonic() - started < 0.5  # failing fast, not one connect timeout each
    index.close()


def test_postgres_lock_timeout_is_a_miss_not_an_outage(tmp_path: Path, pg_url: str) -> None:
    index = connect_index(pg_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    (block,) = [_put(tmp_path, index, ns, m, d) for m, _, d in make_chain(ns, 1)]
    other = index.engine.connect()  # a peer's eviction holds the row
    other.execute(text("SELECT key FROM blocks WHERE key = :k FOR UPDATE"), {"k": block.key})
    with pytest.raises(IndexUnavailable, match="lock timeout"):
        index.remove_blocks([block.key])  # waits lock_timeout (2 s), then gives up
    assert index.get_blocks([block.key]) == {block.key: block}  # no fail-fast window opened
    other.rollback()
    other.close()
    index.close()
    assert_cache_invariants(tmp_path, index_url=pg_url)


def test_nearest_children_find_the_longest_shared_run_among_many_siblings(
    tmp_path: Path, index_url: str
) -> None:
    """Neighbours in token order, not recency: an old sibling is found among 40 newer ones."""
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    root = record_block(FileBlockStore(tmp_path), index, ns, *_meta_data(ns, ns.digest, (1,) * 4))
    template = tuple(range(100, 124))  # the 24 tokens every conversation starts with

    def child(tokens: tuple[int, ...], at: float) -> StoredBlock:
        meta, data = _meta_data(ns, root.key, tokens)
        return record_block(FileBlockStore(tmp_path), index, ns, meta, data, at, tokens=tokens)

    old = child((*template, *range(7000, 7012)), at=1.0)
    newer = [child((*template, 9000 + i, 5, 6), at=10.0 + i) for i in range(40)]
    want = (*template, *range(7000, 7011))  # a replay of the old one, one token short
    assert old.key not in {b.key for b in index.children(root.key, 16)}  # recency loses it
    near = index.nearest_children(root.key, want, 4)
    assert near[0] == (old, (*template, *range(7000, 7012)))
    assert len(near) <= 8 and all(b.parent_key == root.key for b, _ in near)
    assert index.nearest_children("ab" * 32, want, 4) == []
    # Every child has its tokens recorded: none is left for ranking by reading it.
    assert index.children(root.key, 16, headless=True) == []
    store = FileBlockStore(tmp_path)
    headless = record_block(store, index, ns, *_meta_data(ns, root.key, (3,) * 4), at=99.0)
    assert index.children(root.key, 16, headless=True) == [headless]  # the newest, no tokens
    index.remove_blocks([headless.key])
    FileBlockStore(tmp_path).delete(headless.relpath)
    # The head goes with its block.
    index.remove_blocks([old.key, newer[0].key])  # rows first, then files
    for block in (old, newer[0]):
        FileBlockStore(tmp_path).delete(block.relpath)
    assert old.key not in {b.key for b, _ in index.nearest_children(root.key, want, 4)}
    with index.engine.connect() as conn:
        heads = conn.exec_driver_sql("SELECT COUNT(*) FROM block_heads").scalar()
    assert heads == 39
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def _meta_data(ns: NamespaceInfo, parent: str, tokens: tuple[int, ...]) -> tuple[BlockMeta, bytes]:
    meta = BlockMeta(block_key(parent, tokens), parent, ns.digest, len(tokens))
    return meta, pack_block(meta, tokens, [])
