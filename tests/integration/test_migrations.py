"""Alembic migrations on both backends: from nothing, and from every earlier revision with data."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.pool import NullPool

from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex import (
    all_revisions,
    connect_index,
    current_revision,
    head_revision,
    to_url,
    upgrade,
)
from omlx.adapters.sqlindex.migrate import HEAD_REVISION, migrations_dir
from omlx.adapters.sqlindex.models import Base
from omlx.adapters.sqlindex.postgres import make_pg_engine
from omlx.domain.cache.blocks import StoredBlock
from tests.storage_checks import (
    assert_cache_invariants,
    make_chain,
    make_namespace,
    record_block,
)

SRC = Path(__file__).resolve().parents[2] / "src"


def _engine(url: str) -> Engine:
    parsed = to_url(url)
    if parsed.get_backend_name() == "sqlite":
        return create_engine(parsed, poolclass=NullPool)
    return make_pg_engine(parsed, pooled=False)


def _schema(url: str) -> dict[str, set[str]]:
    engine = _engine(url)
    try:
        found = inspect(engine)
        return {
            "table": set(found.get_table_names()),
            "view": set(found.get_view_names()),
            "index": {i["name"] for i in found.get_indexes("blocks")},
        }
    finally:
        engine.dispose()


def test_migrations_ship_with_the_package() -> None:
    folder = migrations_dir()
    assert (folder / "env.py").is_file() and (folder / "script.py.mako").is_file()
    versions = sorted(p.name for p in (folder / "versions").glob("*.py") if p.name != "__init__.py")
    assert versions and all(re.match(r"\d{4}_\d{2}_\d{2}_\d{4}_\w+\.py$", v) for v in versions)
    assert all_revisions()[-1] == head_revision() and len(all_revisions()) == len(versions)
    assert head_revision() == HEAD_REVISION  # the shortcut at start-up knows the newest one


def test_upgrade_from_empty(tmp_path: Path, index_url: str) -> None:
    assert current_revision(index_url) is None
    upgrade(index_url)
    assert current_revision(index_url) == head_revision()
    schema = _schema(index_url)
    assert {
        "namespaces",
        "namespace_hosts",
        "blocks",
        "weight_digests",
        "alembic_version",
    } <= schema["table"]
    assert {
        "ix_blocks_last_access",
        "ix_blocks_namespace_last_access",
        "ix_blocks_parent_key_last_access",
    } <= schema["index"]
    assert "ix_blocks_parent_key" not in schema["index"]  # 0015 replaced it
    assert schema["view"] == {"cache_usage", "lru_blocks", "image_rows"}
    assert "images" in schema["table"]
    if to_url(index_url).get_backend_name() == "sqlite":
        engine = _engine(index_url)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        engine.dispose()
    upgrade(index_url)  # idempotent
    assert current_revision(index_url) == head_revision()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_models_match_the_migrations(index_url: str) -> None:
    upgrade(index_url)
    engine = _engine(index_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def _write_as(url: str, revision: str, store: FileBlockStore) -> tuple[list[StoredBlock], bool]:
    """Rows in the schema of ``revision``, in plain SQL (today's code writes today's schema)."""
    ns = make_namespace()
    revisions = all_revisions()
    at = revisions.index(revision)
    blocks = []
    engine = _engine(url)
    with engine.begin() as conn:
        host_rows = at >= revisions.index("0004")
        conn.execute(
            text(
                "INSERT INTO namespaces (digest, model_name, "
                + ("" if host_rows else "model_path, ")
                + "block_size, kv_dtype, layer_count, created_at, last_used_at) VALUES (:d, :n, "
                + ("" if host_rows else ":p, ")
                + ":b, :k, :l, 1.0, 2.0)"
            ),
            {
                "d": ns.digest,
                "n": ns.model_name,
                "p": ns.model_path,
                "b": ns.block_size,
                "k": ns.kv_dtype,
                "l": ns.layer_count,
            },
        )
        if host_rows:  # 0004 on: the model's path is a fact about this host
            conn.execute(
                text(
                    "INSERT INTO namespace_hosts (namespace, host, model_path, last_used_at) "
                    "VALUES (:d, :h, :p, 2.0)"
                ),
                {"d": ns.digest, "h": socket.gethostname(), "p": ns.model_path},
            )
        for i, (meta, _, data) in enumerate(make_chain(ns, 4)):
            checksum = hashlib.sha256(data).hexdigest()
            rel = store.relpath(ns, meta.key, checksum)
            store.write(rel, data)
            block = StoredBlock(
                meta.key,
                ns.digest,
                meta.parent_key,
                meta.token_count,
                len(data),
                checksum,
                rel,
                float(i),
                float(i),
                hit_count=i,
            )
            conn.execute(
                text(
                    "INSERT INTO blocks (key, namespace, parent_key, token_count, nbytes, checksum,"
                    " relpath, created_at, last_access, hit_count) VALUES (:key, :namespace,"
                    " :parent_key, :token_count, :nbytes, :checksum, :relpath, :created_at,"
                    " :last_access, :hit_count)"
                ),
                {f: getattr(block, f) for f in StoredBlock.__slots__},
            )
            blocks.append(block)
        digests = at >= revisions.index("0002")
        if digests and not host_rows:
            conn.execute(
                text(
                    "INSERT INTO weight_digests (path, size, mtime, digest, computed_at) "
                    "VALUES ('/w', 1, 1.0, 'd', 1.0)"
                )
            )
        elif digests:
            conn.execute(
                text(
                    "INSERT INTO weight_digests (host, path, size, mtime, digest, computed_at) "
                    "VALUES (:h, '/w', 1, 1.0, 'd', 1.0)"
                ),
                {"h": socket.gethostname()},
            )
    engine.dispose()
    return blocks, digests


@pytest.mark.parametrize("revision", all_revisions()[:-1])
def test_upgrade_keeps_data_written_by_an_earlier_revision(
    tmp_path: Path, index_url: str, revision: str
) -> None:
    upgrade(index_url, revision)
    assert current_revision(index_url) == revision
    store = FileBlockStore(tmp_path)
    blocks, digests = _write_as(index_url, revision, store)

    upgrade(index_url)
    assert current_revision(index_url) == head_revision()
    index = connect_index(index_url)  # upgrades again: a no-op
    assert index.get_blocks([b.key for b in blocks]) == {b.key: b for b in blocks}
    # The model path moved to this host's row (0004): the one that ran the upgrade.
    assert [r.info for r in index.namespace_records()] == [make_namespace()]
    assert [b.key for b in index.lru_blocks(10)] == [b.key for b in blocks]
    assert index.children(blocks[0].key, 10) == [blocks[1]]  # 0003 indexed the old rows
    assert "ix_blocks_parent_key_last_access" in _schema(index_url)["index"]
    if digests:
        assert index.weight_digest_lookup("/w", 1, 1.0) == "d"
    index.weight_digest_store("/w2", 1, 1.0, "d2")
    assert index.weight_digest_lookup("/w2", 1, 1.0) == "d2"
    engine = _engine(index_url)
    with engine.connect() as conn:
        usage = conn.execute(
            text("SELECT model_name, blocks, newest_access_utc FROM cache_usage")
        ).all()
    engine.dispose()
    assert [tuple(r) for r in usage] == [(make_namespace().model_name, 4, "1970-01-01 00:00:03")]
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_downgrade_to_the_first_revision_and_back(tmp_path: Path, index_url: str) -> None:
    upgrade(index_url)
    index = connect_index(index_url)
    ns = make_namespace()
    index.upsert_namespace(ns)
    index.close()
    from alembic import command

    from omlx.adapters.sqlindex.migrate import alembic_config

    command.downgrade(alembic_config(index_url), "0001")
    assert current_revision(index_url) == "0001"
    engine = _engine(index_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT model_path FROM namespaces")).scalar() == ns.model_path
    engine.dispose()
    upgrade(index_url)
    index = connect_index(index_url)
    assert [r.info for r in index.namespace_records()] == [ns]
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_concurrent_upgrades_from_two_processes(tmp_path: Path, index_url: str) -> None:
    target = index_url if "postgresql" in index_url else str(tmp_path / "index.db")
    code = f"from omlx.adapters.sqlindex import upgrade; upgrade({target!r})"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert current_revision(index_url) == head_revision()


def test_external_blocks_count_in_cache_usage_and_go_on_downgrade(
    tmp_path: Path, index_url: str
) -> None:
    from alembic import command

    from omlx.adapters.blockfiles.format import RawTensor, pack_layers
    from omlx.adapters.sqlindex.migrate import alembic_config
    from omlx.domain.cache.blocks import BlockMeta
    from omlx.domain.cache.keys import EXTERNAL, external_key

    index, store = connect_index(index_url), FileBlockStore(tmp_path)
    ns = make_namespace()
    index.upsert_namespace(ns)
    ((meta, _, data),) = make_chain(ns, 1)
    kv = record_block(store, index, ns, meta, data)
    h = b"h" * 32
    ext_meta = BlockMeta(external_key(ns.digest, h), h.hex(), ns.digest, 3, EXTERNAL)
    ext_data = pack_layers(ext_meta, [(RawTensor("U8", (2,), b"ab"), RawTensor("U8", (1,), b"c"))])
    checksum = hashlib.sha256(ext_data).hexdigest()
    rel = store.relpath(ns, ext_meta.key, checksum)
    store.write(rel, ext_data)
    ext = StoredBlock(
        ext_meta.key, ns.digest, h.hex(), 3, len(ext_data), checksum, rel, 2.0, 2.0, kind=EXTERNAL
    )
    assert index.add_block(ext)
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)
    engine = _engine(index_url)
    query = text("SELECT blocks, tokens, external_objects, external_bytes FROM cache_usage")
    with engine.connect() as conn:
        assert tuple(conn.execute(query).one()) == (2, ns.block_size + 3, 1, len(ext_data))
    engine.dispose()

    command.downgrade(alembic_config(index_url), "0010")
    engine = _engine(index_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT key FROM blocks")).scalars().all() == [kv.key]
        usage = conn.execute(text("SELECT blocks, tokens FROM cache_usage")).one()
        assert tuple(usage) == (1, ns.block_size)
    engine.dispose()
    upgrade(index_url)
    assert current_revision(index_url) == head_revision()


def test_image_rows_show_in_their_view_count_in_cache_usage_go_with_their_block_and_on_downgrade(
    tmp_path: Path, index_url: str
) -> None:
    from alembic import command

    from omlx.adapters.blockfiles.format import RawTensor
    from omlx.adapters.blockfiles.image_files import pack_image_rows
    from omlx.adapters.sqlindex.migrate import alembic_config
    from omlx.domain.cache.blocks import BlockMeta, ImageInfo
    from omlx.domain.cache.keys import IMAGE, image_rows_key, tenant_root

    index, store = connect_index(index_url), FileBlockStore(tmp_path)
    ns = make_namespace()
    index.upsert_namespace(ns)
    ((meta, _, data),) = make_chain(ns, 1)
    kv = record_block(store, index, ns, meta, data)
    digest = "d1" * 32
    images = []
    for tenant in ("", "acme"):
        root = tenant_root(ns.digest, tenant) if tenant else ns.digest
        key, anchor = image_rows_key(root, digest)
        info = ImageInfo(digest, tenant, 3, 2, "F32")
        img_meta = BlockMeta(key, anchor, ns.digest, 3, IMAGE, image=info)
        img_data = bytes(pack_image_rows(img_meta, RawTensor("F32", (3, 2), bytes(24)), digest))
        checksum = hashlib.sha256(img_data).hexdigest()
        rel = store.relpath(ns, key, checksum)
        store.write(rel, img_data)
        row = StoredBlock(
            key, ns.digest, anchor, 3, len(img_data), checksum, rel, 5.0, 6.0, kind=IMAGE
        )
        assert index.add_block(row, (), info)
        images.append(row)
    assert images[0].key != images[1].key  # a tenant's rows are its own
    assert_cache_invariants(tmp_path, index_url=index_url)
    engine = _engine(index_url)
    view = text(
        "SELECT model_name, digest, tenant, row_count, hidden_size, dtype, nbytes, created_utc,"
        " last_used_utc FROM image_rows ORDER BY tenant"
    )
    usage = text("SELECT blocks, tokens, image_objects, image_bytes FROM cache_usage")
    with engine.connect() as conn:
        shown = [tuple(r) for r in conn.execute(view)]
        assert [r[:7] for r in shown] == [
            (ns.model_name, digest, "", 3, 2, "F32", images[0].nbytes),
            (ns.model_name, digest, "acme", 3, 2, "F32", images[1].nbytes),
        ]
        assert shown[0][7].startswith("1970-01-01 00:00:0")  # created at 5 s, used at 6 s
        counted = tuple(conn.execute(usage).one())
        assert counted == (3, ns.block_size, 2, sum(i.nbytes for i in images))
    engine.dispose()
    index = connect_index(index_url)
    index.remove_blocks([images[1].key])  # eviction deletes the block row: its image goes too
    index.close()
    store.delete(images[1].relpath)
    engine = _engine(index_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT tenant FROM images")).scalars().all() == [""]
    engine.dispose()
    assert_cache_invariants(tmp_path, index_url=index_url)

    command.downgrade(alembic_config(index_url), "0017")
    engine = _engine(index_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT key FROM blocks")).scalars().all() == [kv.key]
        assert tuple(conn.execute(text("SELECT blocks, tokens FROM cache_usage")).one()) == (
            1,
            ns.block_size,
        )
    engine.dispose()
    upgrade(index_url)
    assert current_revision(index_url) == head_revision()


def test_computed_by_is_read_back_everywhere_a_row_is_and_goes_on_downgrade(
    tmp_path: Path, index_url: str
) -> None:
    from dataclasses import replace

    from alembic import command

    from omlx.adapters.sqlindex.migrate import alembic_config

    index, store = connect_index(index_url), FileBlockStore(tmp_path)
    ns = make_namespace()
    index.upsert_namespace(ns)
    (first, _, data0), (second, tokens1, data1) = make_chain(ns, 2)
    old = record_block(store, index, ns, first, data0)  # as a writer before 0019: no name
    checksum = hashlib.sha256(data1).hexdigest()
    rel = store.relpath(ns, second.key, checksum)
    store.write(rel, data1)
    size = second.token_count
    named = StoredBlock(
        second.key, ns.digest, first.key, size, len(data1), checksum, rel, 2.0, 2.0,
        computed_by="studio-1",
    )  # fmt: skip
    assert index.add_block(named, tokens1)
    assert index.get_blocks([old.key, named.key]) == {old.key: old, named.key: named}
    assert old.computed_by is None
    assert index.children(first.key, 4) == [named]
    assert index.nearest_children(first.key, tokens1, 2) == [(named, tuple(tokens1))]
    assert index.lru_blocks(2) == [old, named]
    assert index.usage_by_computer() == [("studio-1", 1, named.nbytes), (None, 1, old.nbytes)]
    index.close()

    command.downgrade(alembic_config(index_url), "0018")
    engine = _engine(index_url)
    assert "computed_by" not in {c["name"] for c in inspect(engine).get_columns("blocks")}
    engine.dispose()
    upgrade(index_url)
    index = connect_index(index_url)
    assert index.get_blocks([named.key]) == {named.key: replace(named, computed_by=None)}
    index.close()
    assert_cache_invariants(tmp_path, index_url=index_url)
