"""Alembic migrations: create from nothing, upgrade an index made by the previous revision."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex import (
    SqlBlockIndex,
    current_revision,
    head_revision,
    index_path,
    make_engine,
    open_index,
    upgrade,
)
from omlx.adapters.sqlindex.migrate import migrations_dir
from omlx.adapters.sqlindex.models import Base
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace, record_block

SRC = Path(__file__).resolve().parents[2] / "src"


def _schema(db: Path) -> dict[str, set[str]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        kinds: dict[str, set[str]] = {}
        for kind, name in rows:
            kinds.setdefault(kind, set()).add(name)
    return kinds


def test_migrations_ship_with_the_package() -> None:
    folder = migrations_dir()
    assert (folder / "env.py").is_file() and (folder / "script.py.mako").is_file()
    versions = sorted(p.name for p in (folder / "versions").glob("*.py") if p.name != "__init__.py")
    assert versions and all(re.match(r"\d{4}_\d{2}_\d{2}_\d{4}_\w+\.py$", v) for v in versions)


def test_upgrade_on_an_empty_folder(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "index.db"
    assert current_revision(db) is None
    upgrade(db)
    assert current_revision(db) == head_revision()
    schema = _schema(db)
    assert {"namespaces", "blocks", "weight_digests", "alembic_version"} <= schema["table"]
    assert {
        "ix_blocks_last_access",
        "ix_blocks_namespace_last_access",
        "ix_blocks_parent_key",
    } <= schema["index"]
    assert schema["view"] == {"cache_usage", "lru_blocks"}
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    upgrade(db)  # idempotent
    assert current_revision(db) == head_revision()
    assert_cache_invariants(db.parent)


def test_models_match_the_migrations(tmp_path: Path) -> None:
    upgrade(tmp_path / "index.db")
    engine = make_engine(tmp_path / "index.db")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_keeps_data_written_by_the_previous_revision(tmp_path: Path) -> None:
    db = index_path(tmp_path)
    upgrade(db, "0001")
    assert current_revision(db) == "0001"
    assert "weight_digests" not in _schema(db)["table"]
    index = SqlBlockIndex(make_engine(db))  # the index as revision 0001 wrote it
    ns = make_namespace()
    index.upsert_namespace(ns)
    store = FileBlockStore(tmp_path)
    blocks = []
    for i, (meta, _, data) in enumerate(make_chain(ns, 4)):
        blocks.append(record_block(store, index, ns, meta, data, float(i), hit_count=i))
    index.close()

    upgrade(db)
    assert current_revision(db) == head_revision()
    index = open_index(tmp_path)  # upgrades again: a no-op
    assert index.get_blocks([b.key for b in blocks]) == {b.key: b for b in blocks}
    assert [r.info for r in index.namespace_records()] == [ns]
    assert [b.key for b in index.lru_blocks(10)] == [b.key for b in blocks]
    assert index.children(blocks[0].key, 10) == [blocks[1]]  # 0003 indexed the old rows
    assert "ix_blocks_parent_key" in _schema(db)["index"]
    index.weight_digest_store("/w", 1, 1.0, "d")
    assert index.weight_digest_lookup("/w", 1, 1.0) == "d"
    index.close()
    assert_cache_invariants(tmp_path)


def test_concurrent_upgrades_from_two_processes(tmp_path: Path) -> None:
    db = tmp_path / "index.db"
    code = f"from omlx.adapters.sqlindex import upgrade; upgrade({str(db)!r})"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert current_revision(db) == head_revision()
