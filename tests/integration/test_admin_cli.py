"""``omlx admin cache ...`` and ``omlx db upgrade`` against real cache folders."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from omlx.adapters.blockfiles.lock import CacheDirLock
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex import (
    connect_index,
    current_revision,
    head_revision,
    index_path,
    open_index,
)
from omlx.app.ops.admin import admin_group, db_group
from omlx.domain.cache.blocks import NamespaceInfo, StoredBlock
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace, record_block

SRC = Path(__file__).resolve().parents[2] / "src"
OLD = time.time() - 3600


def _run(*args: str, group: object = admin_group) -> Result:
    return CliRunner().invoke(group, list(args), catch_exceptions=False)  # type: ignore[arg-type]


def _populate(
    cache_dir: Path, ns: NamespaceInfo, n: int, seed: int = 0, at: float = 1.0
) -> list[StoredBlock]:
    """Blocks as the writer leaves them: file first, row second."""
    index, store = open_index(cache_dir), FileBlockStore(cache_dir)
    index.upsert_namespace(ns)
    blocks = []
    for i, (meta, _, data) in enumerate(make_chain(ns, n, seed=seed)):
        blocks.append(record_block(store, index, ns, meta, data, at + i))
    index.close()
    return blocks


def _age(path: Path) -> None:
    os.utime(path, (OLD, OLD))


def test_stats_and_json(tmp_path: Path) -> None:
    result = _run("cache", "stats", "--cache-dir", str(tmp_path / "none"))
    assert result.exit_code == 0 and "not running" in result.output
    assert not (tmp_path / "none").exists()  # read-only commands create nothing

    ns, other = make_namespace("alpha"), make_namespace("beta")
    a, b = _populate(tmp_path, ns, 3), _populate(tmp_path, other, 2, seed=1)
    index = open_index(tmp_path)  # alpha's blocks computed by one server, beta's unrecorded
    with index.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE blocks SET computed_by = 'studio-1' WHERE namespace = ?", (ns.digest,)
        )
    index.close()
    result = _run("cache", "stats", "--cache-dir", str(tmp_path))
    assert result.exit_code == 0
    assert "alpha" in result.output and "beta" in result.output and "5 blocks" in result.output
    report = json.loads(_run("cache", "stats", "--json", "--cache-dir", str(tmp_path)).stdout)
    by_name = {n["model_name"]: n for n in report["namespaces"]}
    assert by_name["alpha"]["blocks"] == 3 and by_name["beta"]["nbytes"] == sum(x.nbytes for x in b)
    alpha = by_name["alpha"]  # bytes per token per namespace: what its kv_dtype costs
    assert alpha["bytes_per_token"] == round(sum(x.nbytes for x in a) / alpha["tokens"], 1)
    assert "/token" in result.output and alpha["kv_dtype"] in result.output
    assert report["total"]["blocks"] == 5 and report["total"]["nbytes"] == sum(
        x.nbytes for x in a + b
    )
    assert report["index"]["revision"] == head_revision() and report["server_pid"] is None
    assert [(c["server"], c["blocks"]) for c in report["computed_by"]] == [
        ("studio-1", 3),
        (None, 2),
    ]
    assert (
        "computed by:  studio-1 3 blocks" in result.output and "; unknown 2 blocks" in result.output
    )
    with CacheDirLock(tmp_path):
        report = json.loads(_run("cache", "stats", "--json", "--cache-dir", str(tmp_path)).stdout)
        assert report["server_pid"] == os.getpid()
    assert_cache_invariants(tmp_path)


def test_verify_and_fix(tmp_path: Path) -> None:
    ns = make_namespace()
    blocks = _populate(tmp_path, ns, 4)
    assert _run("cache", "verify", "--cache-dir", str(tmp_path)).exit_code == 0
    store = FileBlockStore(tmp_path)
    bad = store.path(blocks[2].relpath)
    data = bytearray(bad.read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    result = _run("cache", "verify", "--cache-dir", str(tmp_path))
    assert result.exit_code == 1
    assert f"BAD {blocks[2].key}" in result.output and "checksum" in result.output
    assert bad.exists()  # verify alone changes nothing
    result = _run("cache", "verify", "--fix", "--cache-dir", str(tmp_path))
    assert result.exit_code == 1 and "removed 1 bad blocks" in result.output
    assert not bad.exists()
    assert _run("cache", "verify", "--cache-dir", str(tmp_path)).exit_code == 0
    assert_cache_invariants(tmp_path)


def test_verify_catches_tokens_that_do_not_rehash(tmp_path: Path) -> None:
    ns = make_namespace()
    blocks = _populate(tmp_path, ns, 2)
    index = open_index(tmp_path)
    # Point block 0's row at block 1's file: checksum fine, key wrong.
    index.remove_blocks([blocks[0].key])
    FileBlockStore(tmp_path).delete(blocks[0].relpath)
    wrong = StoredBlock(
        blocks[0].key,
        ns.digest,
        blocks[0].parent_key,
        4,
        blocks[1].nbytes,
        blocks[1].checksum,
        blocks[1].relpath,
        1.0,
        1.0,
    )
    index.remove_blocks([blocks[1].key])
    index.add_block(wrong)
    index.close()
    result = _run("cache", "verify", "--cache-dir", str(tmp_path))
    assert result.exit_code == 1 and "rehash" in result.output
    _run("cache", "verify", "--fix", "--cache-dir", str(tmp_path))
    assert_cache_invariants(tmp_path)


def _mess(tmp_path: Path, ns: NamespaceInfo) -> dict[str, Path]:
    """Orphans of every kind, old and young."""
    blocks = _populate(tmp_path, ns, 4)
    store = FileBlockStore(tmp_path)
    store.delete(blocks[0].relpath)  # a row without a file
    folder = store.path(blocks[1].relpath).parent
    paths = {
        "old_temp": folder / ".deadbeef.0001.tmp",
        "young_temp": folder / ".deadbeef.0002.tmp",
    }
    for p in paths.values():
        p.write_bytes(b"partial")
    _age(paths["old_temp"])
    for name, (meta, _, data) in zip(
        ("old_orphan", "young_orphan"), make_chain(ns, 2, seed=7), strict=True
    ):
        rel = store.relpath(ns, meta.key, hashlib.sha256(data).hexdigest())
        store.write(rel, data)  # a file without a row
        paths[name] = store.path(rel)
    _age(paths["old_orphan"])
    return paths


def test_vacuum_beside_a_live_server_spares_young_files(tmp_path: Path) -> None:
    ns = make_namespace()
    paths = _mess(tmp_path, ns)
    with CacheDirLock(tmp_path):  # a server owns the folder
        result = _run("cache", "vacuum", "--cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "server running" in result.stderr
    assert "index not compacted while a server runs" in result.output
    assert "removed 1 leftover temporary files" in result.output
    assert "removed 1 rows without files" in result.output
    assert "removed 1 files without rows" in result.output
    assert not paths["old_temp"].exists() and not paths["old_orphan"].exists()
    assert paths["young_temp"].exists() and paths["young_orphan"].exists()

    result = _run("cache", "vacuum", "--cache-dir", str(tmp_path))  # no server: all stale goes
    assert "removed 1 files without rows" in result.output and not paths["young_orphan"].exists()
    assert not paths["young_temp"].exists()
    assert "index compacted" in result.output and "freed" in result.output
    assert_cache_invariants(tmp_path)


def test_vacuum_budget_and_unused_namespaces(tmp_path: Path) -> None:
    live, gone = make_namespace("live"), make_namespace("gone")
    blocks = _populate(tmp_path, live, 6)
    _populate(tmp_path, gone, 3, seed=3)
    index = open_index(tmp_path)
    index.upsert_namespace(replace(gone, model_path=str(tmp_path / "deleted")))
    index.upsert_namespace(replace(live, model_path=str(tmp_path)))  # its model folder exists
    index.close()
    size = blocks[0].nbytes
    result = _run(
        "cache",
        "vacuum",
        "--unused-namespaces",
        "--max-size",
        str(4 * size),
        "--cache-dir",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    assert "dropped unused model gone" in result.output and "model live" not in result.output
    assert "evicted 2 least recently used blocks" in result.output
    index = open_index(tmp_path)
    assert {r.info.model_name for r in index.namespace_records()} == {"live"}
    assert [b.key for b in index.lru_blocks(10)] == [b.key for b in blocks[2:]]
    index.close()
    assert_cache_invariants(tmp_path, 4 * size)
    assert (
        _run("cache", "vacuum", "--max-size", "lots", "--cache-dir", str(tmp_path)).exit_code == 2
    )


def test_clear_needs_yes(tmp_path: Path) -> None:
    ns, other = make_namespace("alpha"), make_namespace("beta")
    _populate(tmp_path, ns, 3)
    _populate(tmp_path, other, 2, seed=1)
    result = _run("cache", "clear", "--cache-dir", str(tmp_path))
    assert result.exit_code == 2 and "--yes" in result.output
    assert open_index(tmp_path).block_count() == 5
    result = _run("cache", "clear", "--model", "nope", "--yes", "--cache-dir", str(tmp_path))
    assert result.exit_code == 1 and "alpha" in result.output
    result = _run("cache", "clear", "--model", "alpha", "--yes", "--cache-dir", str(tmp_path))
    assert result.exit_code == 0 and "cleared 3 blocks" in result.output
    assert_cache_invariants(tmp_path)
    assert _run("cache", "clear", "--yes", "--cache-dir", str(tmp_path)).exit_code == 0
    assert list(FileBlockStore(tmp_path).iter_relpaths()) == []
    assert_cache_invariants(tmp_path)


def test_db_upgrade_on_an_empty_folder(tmp_path: Path) -> None:
    result = _run("upgrade", "--cache-dir", str(tmp_path / "new"), group=db_group)
    assert result.exit_code == 0 and f"-> {head_revision()}" in result.output
    assert current_revision(index_path(tmp_path / "new")) == head_revision()
    assert_cache_invariants(tmp_path / "new")


def test_cache_dir_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMLX_CACHE_DIR", str(tmp_path))
    _populate(tmp_path, make_namespace(), 2)
    report = json.loads(_run("cache", "stats", "--json").stdout)
    assert report["cache_dir"] == str(tmp_path) and report["total"]["blocks"] == 2


def test_cache_dir_and_index_from_the_server_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No --cache-dir and no OMLX_CACHE_DIR: the folder and index omlx serve would use.
    monkeypatch.delenv("OMLX_CACHE_DIR", raising=False)
    monkeypatch.setenv("OMLX_PAGED_SSD_CACHE_DIR", str(tmp_path))
    _populate(tmp_path, make_namespace(), 3)
    report = json.loads(_run("cache", "stats", "--json").stdout)
    assert report["cache_dir"] == str(tmp_path) and report["total"]["blocks"] == 3
    monkeypatch.setenv("OMLX_INDEX_URL", "sqlite:///" + str(tmp_path / "elsewhere.db"))
    report = json.loads(_run("cache", "stats", "--json").stdout)
    assert report["total"]["blocks"] == 0  # that other, empty index: the URL was honoured
    monkeypatch.setenv("OMLX_BLOCK_SIZE", "0")
    result = _run("cache", "stats", "--json")
    assert result.exit_code != 0 and "block_size" in result.output


def test_admin_never_imports_litestar_or_mlx(tmp_path: Path) -> None:
    _populate(tmp_path, make_namespace(), 2)
    code = (
        "import sys\n"
        "from omlx.app.ops.admin import admin_group, db_group\n"
        f"for args in (['cache', 'stats', '--cache-dir', {str(tmp_path)!r}],\n"
        f"             ['cache', 'verify', '--cache-dir', {str(tmp_path)!r}],\n"
        f"             ['cache', 'vacuum', '--cache-dir', {str(tmp_path)!r}]):\n"
        "    try:\n"
        "        admin_group.main(args, standalone_mode=False)\n"
        "    except SystemExit as exc:\n"
        "        assert not exc.code, exc.code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('litestar', 'mlx', 'mlx_lm'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert_cache_invariants(tmp_path)


# --- a shared PostgreSQL index (--index-url) -----------------------------------------------


def _populate_shared(
    cache_dir: Path, url: str, ns: NamespaceInfo, n: int, seed: int = 0
) -> list[StoredBlock]:
    index, store = connect_index(url), FileBlockStore(cache_dir)
    index.upsert_namespace(ns)
    blocks = [
        record_block(store, index, ns, meta, data, 1.0 + i)
        for i, (meta, _, data) in enumerate(make_chain(ns, n, seed=seed))
    ]
    index.close()
    return blocks


def test_shared_index_commands(tmp_path: Path, pg_url: str) -> None:
    url = ("--index-url", pg_url)
    result = _run("cache", "stats", "--cache-dir", str(tmp_path), *url)
    assert result.exit_code == 0 and "revision None" in result.output
    assert current_revision(pg_url) is None  # read-only commands create nothing
    assert _run("upgrade", "--cache-dir", str(tmp_path), *url, group=db_group).exit_code == 0
    assert current_revision(pg_url) == head_revision()
    blocks = _populate_shared(tmp_path, pg_url, make_namespace("alpha"), 4)
    report = json.loads(_run("cache", "stats", "--json", "--cache-dir", str(tmp_path), *url).stdout)
    assert report["index"]["shared"] and "@127.0.0.1" in report["index"]["path"]
    assert report["total"]["blocks"] == 4 and report["index"]["nbytes"] > 0
    assert _run("cache", "verify", "--cache-dir", str(tmp_path), *url).exit_code == 0

    store = FileBlockStore(tmp_path)
    store.delete(blocks[0].relpath)  # a row without a file, old
    result = _run("cache", "vacuum", "--cache-dir", str(tmp_path), *url)
    assert result.exit_code == 0, result.output
    assert "shared index" in result.stderr and "removed 1 rows without files" in result.output
    assert "VACUUM ANALYZE" in result.output
    result = _run("cache", "clear", "--yes", "--cache-dir", str(tmp_path), *url)
    assert result.exit_code == 0 and "cleared 3 blocks" in result.output
    assert_cache_invariants(tmp_path, index_url=pg_url)


def test_shared_vacuum_spares_young_rows_and_files(tmp_path: Path, pg_url: str) -> None:
    ns = make_namespace()
    index, store = connect_index(pg_url), FileBlockStore(tmp_path)
    index.upsert_namespace(ns)
    (m0, _, d0), (m1, _, d1) = make_chain(ns, 2)
    young_row = record_block(store, index, ns, m0, d0, time.time())
    store.delete(young_row.relpath)  # a peer's new file this host cannot see yet
    young_file = store.relpath(ns, m1.key, hashlib.sha256(d1).hexdigest())
    store.write(young_file, d1)  # a peer's file about to get its row
    index.close()
    result = _run("cache", "vacuum", "--cache-dir", str(tmp_path), "--index-url", pg_url)
    assert "removed 0 rows without files" in result.output
    assert "removed 0 files without rows" in result.output
    assert store.file_info(young_file) is not None
    result = _run(
        "cache", "vacuum", "--grace", "0", "--cache-dir", str(tmp_path), "--index-url", pg_url
    )
    assert "removed 1 rows without files" in result.output and store.file_info(young_file) is None
    assert_cache_invariants(tmp_path, index_url=pg_url)


def test_unreachable_index_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    url = "postgresql+psycopg://omlx@127.0.0.1:1/omlx"
    result = CliRunner().invoke(
        admin_group, ["cache", "stats", "--cache-dir", str(tmp_path), "--index-url", url]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "cannot reach the index" in result.output or "unreachable" in result.output
    result = CliRunner().invoke(db_group, ["upgrade", "--index-url", "mysql://x/y"])
    assert result.exit_code == 1 and "only sqlite" in result.output


def test_sqlite_index_on_a_network_filesystem_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("omlx.adapters.sqlindex.netfs.filesystem_type", lambda path: "nfs4")
    result = CliRunner().invoke(db_group, ["upgrade", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1 and "network filesystem (nfs4)" in result.output
    assert "--index-url postgresql" in result.output
    assert not (tmp_path / "index.db").exists()


def test_blocks_of_an_older_block_format_are_collected_never_read(tmp_path: Path) -> None:
    from sqlalchemy import text

    from omlx.adapters.blockfiles.maintenance import collect_old_formats

    index = open_index(tmp_path)
    store = FileBlockStore(tmp_path)
    old, new = make_namespace(), replace(make_namespace(), digest="ee" * 32, model_name="current")
    for ns in (old, new):
        index.upsert_namespace(ns)
        for meta, _, data in make_chain(ns, 3):
            record_block(store, index, ns, meta, data)
    with index.engine.begin() as conn:  # written by a server of block format 1
        conn.execute(
            text("UPDATE namespaces SET format_version = 1 WHERE digest = :d"), {"d": old.digest}
        )
    assert index.old_format_namespaces() == [old.digest]
    assert collect_old_formats(index, store) == 3
    left = {b.namespace for b in index.iter_blocks()}
    index.close()
    assert left == {new.digest}
    assert_cache_invariants(tmp_path)


def test_vacuum_beside_a_live_server_spares_recently_used_blocks_from_the_budget(
    tmp_path: Path,
) -> None:
    """The grace the vacuum announces holds for --max-size eviction too (issue 27)."""
    ns = make_namespace()
    now = time.time()
    old = _populate(tmp_path, ns, 2, at=OLD)  # used an hour ago
    young = _populate(tmp_path, ns, 2, seed=5, at=now - 30)  # used 30 s ago
    with CacheDirLock(tmp_path):  # a server owns the folder
        result = _run("cache", "vacuum", "--max-size", "1", "--cache-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "blocks used in the last 60 s are left alone" in result.stderr
    assert "evicted 2 least recently used blocks" in result.output
    assert "blocks used in the last 60 s were spared" in result.output
    index = open_index(tmp_path)
    assert {b.key for b in index.lru_blocks(10)} == {b.key for b in young}
    index.close()
    assert not any((tmp_path / b.relpath).exists() for b in old)


def test_clear_counts_in_the_singular(tmp_path: Path) -> None:
    _populate(tmp_path, make_namespace(), 1)
    result = _run("cache", "clear", "--yes", "--cache-dir", str(tmp_path))
    assert "cleared 1 block of 1 namespace (" in result.output
