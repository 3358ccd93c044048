"""The ``BlockStore`` contract, one suite over every store: the cache folder's files, a real
SeaweedFS bucket, and the bucket read through local copies.

Each test ends with the invariant over the store (rows <=> complete objects, usage
within the budget), read through the store itself.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from omlx.adapters.blockfiles.budget import DiskBudget, SizeBudget
from omlx.adapters.blockfiles.maintenance import ListableStore, reconcile
from omlx.adapters.blockfiles.store import FileBlockStore, key_of
from omlx.adapters.blockfiles.writer import BlockWriter
from omlx.adapters.objectstore import ReadThroughStore, S3BlockStore, S3Location
from omlx.adapters.sqlindex import SqlBlockIndex, connect_index, sqlite_url
from omlx.domain.cache.blocks import ReadFailure, StoredBlock
from omlx.domain.cache.cold_tier import ColdTier
from tests.seaweedfs import SeaweedServer
from tests.storage_checks import (
    assert_store_invariants,
    fake_decode,
    make_chain,
    make_namespace,
    no_model_check,
)

KINDS = ["folder", "s3", "s3-read-through"]


@dataclass
class Subject:
    """A store under test, its index, and a way to reach past it to its bytes."""

    store: ListableStore
    index: SqlBlockIndex
    index_url: str
    overwrite: object  # (relpath, data) -> None: replace the bytes behind the store's back


@pytest.fixture(params=KINDS)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    url = sqlite_url(tmp_path / "index.db")
    index = connect_index(url)
    if request.param == "folder":
        (tmp_path / "blocks").mkdir()
        store: ListableStore = FileBlockStore(tmp_path / "blocks")

        def overwrite(relpath: str, data: bytes) -> None:
            store.path(relpath).write_bytes(data)  # type: ignore[attr-defined]

    else:
        weed: SeaweedServer = request.getfixturevalue("seaweedfs")
        prefix = weed.new_prefix()
        remote = S3BlockStore(S3Location.parse(prefix), weed.access())
        store = remote
        if request.param == "s3-read-through":
            store = ReadThroughStore(
                remote, FileBlockStore(tmp_path / "copies", durable=False), 10**9
            )

        def overwrite(relpath: str, data: bytes) -> None:
            weed.put(prefix, relpath, data)

    yield Subject(store, index, url, overwrite)
    store.close()
    index.close()


def _write_chain(subject: Subject, n: int, seed: int = 0) -> list[StoredBlock]:
    """``n`` blocks written the writer's way: the object first, then its row."""
    ns = make_namespace()
    subject.index.upsert_namespace(ns)
    rows = []
    for meta, tokens, data in make_chain(ns, n, seed=seed):
        checksum = hashlib.sha256(data).hexdigest()
        relpath = subject.store.relpath(ns, meta.key, checksum)
        subject.store.write(relpath, data)
        now = time.time()
        row = StoredBlock(
            meta.key,
            ns.digest,
            meta.parent_key,
            len(tokens),
            len(data),
            checksum,
            relpath,
            now,
            now,
        )
        assert subject.index.add_block(row, tokens)
        rows.append(row)
    return rows


def test_write_read_delete_and_list(subject: Subject) -> None:
    rows = _write_chain(subject, 4)
    store = subject.store
    # One layout everywhere: the name carries the key and the checksum's head.
    assert rows[0].relpath == FileBlockStore("/unused").relpath(
        make_namespace(), rows[0].key, rows[0].checksum
    )
    assert key_of(rows[0].relpath) == rows[0].key
    data = store.read(rows[0].relpath)
    assert hashlib.sha256(data).hexdigest() == rows[0].checksum
    store.write(rows[0].relpath, data)  # the same name again: its bytes are already there
    listed = {rel: (size, modified) for rel, size, modified in store.iter_objects()}  # type: ignore[attr-defined]
    assert set(listed) == {r.relpath for r in rows} == set(store.iter_relpaths())
    size, modified = listed[rows[1].relpath]
    assert size == rows[1].nbytes and abs(modified - time.time()) < 120
    assert store.file_info(rows[1].relpath) == (size, pytest.approx(modified, abs=1))  # type: ignore[attr-defined]
    gone = rows.pop()
    subject.index.remove_blocks([gone.key])  # rows first, objects second
    store.delete(gone.relpath)
    store.delete(gone.relpath)  # a missing object is not an error
    with pytest.raises(FileNotFoundError):
        store.read(gone.relpath)
    assert store.file_info(gone.relpath) is None  # type: ignore[attr-defined]
    assert store.remove_temp_files() == 0
    assert_store_invariants(store, subject.index_url)


def test_read_many_verifies_every_object(subject: Subject) -> None:
    rows = _write_chain(subject, 8)
    good = subject.store.read(rows[2].relpath)
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 1
    subject.overwrite(rows[2].relpath, bytes(flipped))  # type: ignore[operator]
    subject.overwrite(rows[3].relpath, good[:-7])  # type: ignore[operator]
    subject.store.delete(rows[4].relpath)
    if isinstance(subject.store, ReadThroughStore):  # what the copies held is served (verified)
        subject.store.local.delete(rows[2].relpath)
        subject.store.local.delete(rows[3].relpath)
    reads = list(subject.store.read_many(rows))
    assert [r.block.key for r in reads] == [r.key for r in rows]  # in order, all of them
    assert [r.data is not None for r in reads] == [
        True,
        True,
        False,
        False,
        False,
        True,
        True,
        True,
    ]
    assert reads[2].failure is ReadFailure.MISMATCH and reads[3].failure is ReadFailure.MISMATCH
    assert reads[4].failure is ReadFailure.MISSING
    assert all(
        hashlib.sha256(r.data).hexdigest() == r.block.checksum for r in reads if r.data is not None
    )
    with closing(subject.store.read_many(rows)) as batch:
        assert next(batch).data is not None  # closed early: the rest are not waited for
    for row in rows[2:5]:  # the bad ones go: rows first, objects second
        subject.index.remove_blocks([row.key])
        subject.store.delete(row.relpath)
    assert_store_invariants(subject.store, subject.index_url)


def test_reconcile_sweeps_orphans_after_the_grace(subject: Subject) -> None:
    rows = _write_chain(subject, 5)
    orphan = _write_chain(subject, 1, seed=7)[0]
    subject.index.remove_blocks([orphan.key])  # a PUT whose row never came (a crash)
    lost = rows.pop()
    subject.store.delete(lost.relpath)  # a row whose object went (someone else's delete)
    young = reconcile(subject.index, subject.store, grace=3600)
    assert (young.files_without_rows, young.rows_without_files) == (0, 0)  # all too young
    assert orphan.relpath in set(subject.store.iter_relpaths())
    report = reconcile(subject.index, subject.store, grace=None)
    assert (report.files_without_rows, report.rows_without_files) == (1, 1)
    assert report.orphan_bytes == orphan.nbytes
    assert orphan.relpath not in set(subject.store.iter_relpaths())
    assert_store_invariants(subject.store, subject.index_url)


def test_the_cold_tier_over_the_store(subject: Subject) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 12, kv_bytes=4096)
    per_block = len(chain[0][2])
    budget = 8 * per_block
    if isinstance(subject.store, FileBlockStore):  # no free-space reserve in this test
        limit: DiskBudget | SizeBudget = DiskBudget(subject.store.root, budget, reserve_bytes=0)
    else:
        limit = subject.store.budget(budget)  # a bucket's: the size alone
    writer = BlockWriter(subject.store, subject.index, limit, tick_interval=0.01)
    tier = ColdTier(ns, subject.store, subject.index, writer, fake_decode, check=no_model_check)
    try:
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
        deadline = time.monotonic() + 30
        while writer.pending_keys() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.stats().written == 12 and writer.stats().evicted_blocks == 4
        tail = [(meta.key, meta.parent_key) for meta, _, _ in chain[4:]]
        served = list(tier.get_many(tail))
        assert [tokens for tokens, _ in served] == [tokens for _, tokens, _ in chain[4:]]
    finally:
        writer.close(timeout=10)
        tier.close()
    assert_store_invariants(subject.store, subject.index_url, budget)
