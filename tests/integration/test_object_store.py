"""The object store beyond the shared contract, over a real SeaweedFS: the read-through
tier's local copies, faults (the store stopped mid-run, a corrupt object, wrong keys),
and the writer's bounded retries.

Each storage test ends with the invariant over the bucket: rows <=> complete objects.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from omlx.adapters.blockfiles.budget import SizeBudget
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.blockfiles.writer import RETRY_ATTEMPTS, BlockWriter
from omlx.adapters.objectstore import (
    ReadThroughStore,
    S3Access,
    S3BlockStore,
    S3Location,
    StoreDenied,
    StoreUnreachable,
)
from omlx.adapters.sqlindex import SqlBlockIndex, connect_index, sqlite_url
from omlx.domain.cache.blocks import NamespaceInfo, StoredBlock
from omlx.domain.cache.cold_tier import ColdTier
from tests.seaweedfs import SECRET_KEY, SeaweedServer
from tests.storage_checks import (
    assert_store_invariants,
    fake_decode,
    make_chain,
    make_namespace,
    no_model_check,
)

SRC = Path(__file__).resolve().parents[2] / "src"


def _remote(weed: SeaweedServer, url: str, secret: str = SECRET_KEY) -> S3BlockStore:
    return S3BlockStore(S3Location.parse(url), weed.access(secret))


def _record(store, index: SqlBlockIndex, ns: NamespaceInfo, n: int, seed: int = 0):
    """``n`` blocks written through ``store`` (object first, row second); their rows."""
    index.upsert_namespace(ns)
    rows = []
    for meta, tokens, data in make_chain(ns, n, kv_bytes=2048, seed=seed):
        checksum = hashlib.sha256(data).hexdigest()
        relpath = store.relpath(ns, meta.key, checksum)
        store.write(relpath, data)
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
        index.add_block(row, tokens)
        rows.append(row)
    return rows


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[SqlBlockIndex, str]]:
    url = sqlite_url(tmp_path / "index.db")
    idx = connect_index(url)
    yield idx, url
    idx.close()


# --- the read-through tier ------------------------------------------------------------


def test_a_second_read_comes_from_the_local_copy(
    seaweedfs: SeaweedServer, s3_url: str, tmp_path: Path, index: tuple[SqlBlockIndex, str]
) -> None:
    idx, url = index
    remote = _remote(seaweedfs, s3_url)
    rows = _record(remote, idx, make_namespace(), 10)  # straight to the bucket: no copies yet
    store = ReadThroughStore(remote, FileBlockStore(tmp_path / "copies", durable=False), 10**9)
    assert all(r.data is not None for r in store.read_many(rows))
    assert remote.requests == 10  # one GET per block, issued in parallel
    assert store.drain()  # the copies are written off the restore's path
    assert all(r.data is not None for r in store.read_many(rows))
    assert remote.requests == 10  # none more: every block from its local copy
    stats = store.stats()
    assert (stats.local_hits, stats.remote_reads, stats.kept) == (10, 10, 10)
    assert stats.nbytes == sum(r.nbytes for r in rows)
    # A restart finds the copies (same layout, same format as the folder store's files).
    again = ReadThroughStore(remote, FileBlockStore(tmp_path / "copies", durable=False), 10**9)
    assert all(r.data is not None for r in again.read_many(rows))
    assert remote.requests == 10 and again.stats().local_hits == 10
    # Blocks written through it are kept as they go up: read back with no GET.
    written = _record(again, idx, make_namespace("other/model"), 3, seed=5)
    assert again.drain()
    assert all(r.data is not None for r in again.read_many(written))
    assert remote.requests == 10
    store.close()
    again.close()
    assert_store_invariants(remote, url)


def test_the_local_copies_keep_their_budget_least_recently_used_first(
    seaweedfs: SeaweedServer, s3_url: str, tmp_path: Path, index: tuple[SqlBlockIndex, str]
) -> None:
    idx, url = index
    remote = _remote(seaweedfs, s3_url)
    rows = _record(remote, idx, make_namespace(), 6)
    per_block = rows[0].nbytes
    copies = FileBlockStore(tmp_path / "copies", durable=False)
    store = ReadThroughStore(remote, copies, 3 * per_block)
    for row in [*rows[:3], rows[0], *rows[3:5]]:  # block 0 used again: the newest of the three
        assert next(store.read_many([row])).data is not None
        assert store.drain()
    on_disk = set(copies.iter_relpaths())
    assert on_disk == {rows[0].relpath, rows[3].relpath, rows[4].relpath}  # 1 and 2 went
    assert (
        store.stats().nbytes == 3 * per_block == sum(size for _, size, _ in copies.iter_objects())
    )
    before = remote.requests
    assert next(store.read_many([rows[1]])).data is not None  # evicted: fetched again
    assert remote.requests == before + 1
    store.close()
    assert_store_invariants(remote, url)


def test_a_corrupt_local_copy_is_deleted_and_fetched_again(
    seaweedfs: SeaweedServer, s3_url: str, tmp_path: Path, index: tuple[SqlBlockIndex, str]
) -> None:
    idx, url = index
    remote = _remote(seaweedfs, s3_url)
    rows = _record(remote, idx, make_namespace(), 2)
    copies = FileBlockStore(tmp_path / "copies", durable=False)
    store = ReadThroughStore(remote, copies, 10**9)
    assert all(r.data is not None for r in store.read_many(rows))
    assert store.drain()
    path = copies.path(rows[1].relpath)
    damaged = bytearray(path.read_bytes())
    damaged[100] ^= 0xFF
    path.write_bytes(bytes(damaged))
    before = remote.requests
    reads = list(store.read_many(rows))
    assert all(r.data is not None for r in reads)  # the remote object, not the bad copy
    assert hashlib.sha256(reads[1].data or b"").hexdigest() == rows[1].checksum
    assert remote.requests == before + 1 and store.stats().corrupt_copies == 1
    assert store.drain()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == rows[1].checksum  # copy replaced
    store.close()
    assert_store_invariants(remote, url)


# --- faults -----------------------------------------------------------------------------


def test_a_corrupt_object_is_never_served_and_is_recomputed(
    seaweedfs: SeaweedServer, s3_url: str, tmp_path: Path, index: tuple[SqlBlockIndex, str]
) -> None:
    idx, url = index
    ns = make_namespace()
    chain = make_chain(ns, 3)
    remote = _remote(seaweedfs, s3_url)
    store = ReadThroughStore(remote, FileBlockStore(tmp_path / "copies", durable=False), 10**9)
    writer = BlockWriter(store, idx, SizeBudget(10**9), tick_interval=0.01)
    tier = ColdTier(ns, store, idx, writer, fake_decode, check=no_model_check)
    try:
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
        _drain(writer)
        bad = idx.get_blocks([chain[1][0].key])[chain[1][0].key]
        store.local.delete(bad.relpath)  # this server's own copy would be served, and rightly
        seaweedfs.put(s3_url, bad.relpath, chain[1][2][:-16] + b"\0" * 16)  # same size, bad bytes
        served = list(tier.get_many([(m.key, m.parent_key) for m, _, _ in chain]))
        assert len(served) == 1  # block 0 only: block 1 stops the chain
        assert tier.stats().corrupt_blocks == 1
        assert idx.get_blocks([bad.key]) == {}  # its row went first, then its object
        assert bad.relpath not in seaweedfs.names(s3_url)
        meta, tokens, data = chain[1]
        tier.put(meta, tokens, data)  # recomputed: written again, served again
        _drain(writer)
        assert len(list(tier.get_many([(m.key, m.parent_key) for m, _, _ in chain]))) == 3
    finally:
        writer.close(timeout=10)
        tier.close()
    assert_store_invariants(remote, url)


def test_wrong_keys_or_no_bucket_are_refused_in_one_line(
    seaweedfs: SeaweedServer, s3_url: str
) -> None:
    with pytest.raises(StoreDenied) as denied:
        _remote(seaweedfs, s3_url, secret="not-the-secret").check()
    assert "SignatureDoesNotMatch" in str(denied.value) and "\n" not in str(denied.value)
    with pytest.raises(StoreDenied, match=r"NoSuchBucket|no such bucket"):
        _remote(seaweedfs, "s3://no-such-bucket/x").check()
    _remote(seaweedfs, s3_url).check()  # the right keys: one listing, no error
    dead = S3BlockStore(
        S3Location.parse(s3_url),
        S3Access(endpoint="http://127.0.0.1:9", access_key_id="k", secret_access_key="s"),
    )
    started = time.monotonic()
    with pytest.raises(StoreUnreachable):
        dead.check()
    assert time.monotonic() - started < 10  # connect timeout and a few retries, not minutes


def test_admin_with_wrong_keys_says_so_in_one_line(
    seaweedfs: SeaweedServer, s3_url: str, tmp_path: Path
) -> None:
    connect_index(sqlite_url(tmp_path / "index.db")).close()
    env = {
        **os.environ,
        **seaweedfs.env(AWS_SECRET_ACCESS_KEY="not-the-secret"),
        "PYTHONPATH": str(SRC),
    }
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "omlx", "admin", "cache", "vacuum"),
            *("--cache-dir", str(tmp_path), "--block-store", s3_url),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "object store" in errors[0] and "403" in errors[0], proc.stderr


class _DownStore(FileBlockStore):
    """A store whose every write fails as an unreachable object store's does."""

    def write(self, relpath: str, data: bytes) -> None:
        raise StoreUnreachable(f"PUT {relpath}: HTTP 503 SlowDown")


def test_a_transient_fault_is_retried_a_few_times_then_dropped_and_counted(
    tmp_path: Path, index: tuple[SqlBlockIndex, str], caplog: pytest.LogCaptureFixture
) -> None:
    idx, _ = index
    ns = make_namespace()
    writer = BlockWriter(_DownStore(tmp_path), idx, SizeBudget(10**9), tick_interval=0.01)
    writer.retry_first_s = 0.01
    outcomes: list[str] = []
    with caplog.at_level(logging.WARNING):
        for meta, _, data in make_chain(ns, 2):
            assert writer.submit(meta, ns, data, done=outcomes.append)
        deadline = time.monotonic() + 10
        while writer.pending_keys() and time.monotonic() < deadline:
            time.sleep(0.01)
    writer.close(timeout=5)
    stats = writer.stats()
    assert outcomes == ["dropped_unreachable"] * 2
    assert stats.retried == 2 * RETRY_ATTEMPTS and stats.dropped_unreachable == 2
    assert stats.awaiting_retry == 0 and idx.block_count() == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cannot be reached" in warnings[0], warnings


@pytest.mark.slow
def test_the_store_stopped_mid_run_reads_miss_and_writes_wait_for_it(
    own_seaweedfs: SeaweedServer,
    tmp_path: Path,
    index: tuple[SqlBlockIndex, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    idx, url = index
    s3_url = own_seaweedfs.new_prefix()
    ns = make_namespace()
    chain = make_chain(ns, 8, kv_bytes=2048)
    remote = _remote(own_seaweedfs, s3_url)
    with _tier(remote, tmp_path / "a", idx, ns) as (tier, writer):
        for meta, tokens, data in chain[:4]:
            tier.put(meta, tokens, data)
        _drain(writer)
    # A second server's view (no local copies): everything it reads must come from the bucket.
    with _tier(remote, tmp_path / "b", idx, ns) as (tier, writer), caplog.at_level(logging.INFO):
        own_seaweedfs.stop()
        started = time.monotonic()
        pairs = [(m.key, m.parent_key) for m, _, _ in chain]
        assert list(tier.get_many(pairs[:4])) == []  # misses, no exception
        assert list(tier.get_many(pairs[:4])) == []
        assert time.monotonic() - started < 15
        assert idx.block_count() == 4  # an unreachable store is not a missing object
        for meta, tokens, data in chain[4:]:
            tier.put(meta, tokens, data)  # the writer keeps them for later
        deadline = time.monotonic() + 10
        while writer.stats().retried < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writer.stats().retried >= 4 and writer.pending_keys()
        own_seaweedfs.start()
        _drain(writer, timeout=60)
        stats = writer.stats()
        assert stats.written == 4 and stats.dropped_unreachable == 0
        assert len(list(tier.get_many(pairs))) == 8  # all of it, from the bucket again
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    down = [line for line in lines if "cannot be reached" in line]
    assert len(down) == 2, lines  # one for the reads' episode, one for the writes'
    assert not any("Traceback" in line or "not served" in line for line in lines)
    assert any("answers again" in r.getMessage() for r in caplog.records)
    assert_store_invariants(remote, url)


@contextmanager
def _tier(remote: S3BlockStore, copies: Path, idx: SqlBlockIndex, ns: NamespaceInfo):
    store = ReadThroughStore(remote, FileBlockStore(copies, durable=False), 10**9)
    writer = BlockWriter(store, idx, SizeBudget(10**9), tick_interval=0.01)
    writer.retry_first_s = 0.2
    tier = ColdTier(ns, store, idx, writer, fake_decode, check=no_model_check)
    try:
        yield tier, writer
    finally:
        writer.close(timeout=10)
        tier.close()


def _drain(writer: BlockWriter, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while writer.pending_keys() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not writer.pending_keys(), writer.stats()
