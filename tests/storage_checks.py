"""Helpers for storage tests: real block files, and the cold tier's invariant (STYLE 17).

Invariant: every index row has a complete file matching its checksum, every block
file has a row, no temporary file is left, and the blocks fit the byte budget.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path

from omlx.adapters.blockfiles.format import RawTensor, kv_layers, pack_block, unpack_block
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex.database import index_path, make_engine
from omlx.adapters.sqlindex.repository import SqlBlockIndex, connect_index
from omlx.domain.cache.blocks import BlockMeta, DecodedBlock, NamespaceInfo, StoredBlock
from omlx.domain.cache.keys import block_key, namespace_digest


def make_namespace(model_name: str = "org/Tiny Model", **identity: object) -> NamespaceInfo:
    digest = namespace_digest({"model": model_name, **identity})
    return NamespaceInfo(digest, model_name, f"/models/{model_name}", 4, "bf16", 2)


def make_chain(
    namespace: NamespaceInfo, n_blocks: int, *, kv_bytes: int = 256, seed: int = 0
) -> list[tuple[BlockMeta, tuple[int, ...], bytes]]:
    """``n_blocks`` chained blocks of random tokens; each file holds ~``2*layers*kv_bytes`` KV bytes."""
    rng = random.Random(seed)
    parent = namespace.digest
    chain = []
    for _ in range(n_blocks):
        tokens = tuple(rng.randrange(50_000) for _ in range(namespace.block_size))
        key = block_key(parent, tokens)
        meta = BlockMeta(
            key=key, parent_key=parent, namespace=namespace.digest, token_count=len(tokens)
        )
        layers = [
            (
                RawTensor("BF16", (kv_bytes // 2,), rng.randbytes(kv_bytes)),
                RawTensor("BF16", (kv_bytes // 2,), rng.randbytes(kv_bytes)),
            )
            for _ in range(namespace.layer_count)
        ]
        chain.append((meta, tokens, pack_block(meta, tokens, layers)))
        parent = key
    return chain


def record_block(
    store: FileBlockStore,
    index: SqlBlockIndex,
    ns: NamespaceInfo,
    meta: BlockMeta,
    data: bytes,
    at: float = 1.0,
    hit_count: int = 0,
    tokens: Sequence[int] = (),
) -> StoredBlock:
    """File first, row second: a block recorded the way the writer records it."""
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
        at,
        at,
        hit_count=hit_count,
    )
    index.add_block(block, tokens)
    return block


def fake_decode(data: bytes) -> DecodedBlock:
    """A codec ``decode`` without MLX: the payload is the number of layers."""
    tokens, tensors, metadata = unpack_block(data)
    return DecodedBlock(tokens, len(kv_layers(tensors, metadata)), metadata)


def no_model_check(data: bytes, meta: BlockMeta, *, values: bool = True) -> str | None:
    """A codec ``check`` for tests of storage alone: no model whose blocks to compare with
    (tests/integration/test_block_checks.py checks files against a real model's spec)."""
    return None


def block_files_bytes(cache_dir: Path) -> int:
    store = FileBlockStore(cache_dir)
    return sum((store.root / rel).stat().st_size for rel in store.iter_relpaths())


def assert_cache_invariants(
    cache_dir: Path,
    max_bytes: int | None = None,
    *,
    allow_temp: Sequence[str] = (),
    index_url: str | None = None,
) -> None:
    """Rows <=> complete files, no leftover temp files, usage within ``max_bytes``.

    ``index_url``: the index when it is not ``<cache_dir>/index.db`` (PostgreSQL).
    """
    store = FileBlockStore(cache_dir)
    if index_url is None:
        index = SqlBlockIndex(make_engine(index_path(cache_dir)))
    else:
        index = connect_index(index_url, migrate=False)
    try:
        blocks = list(index.iter_blocks())
        total = index.total_bytes()
    finally:
        index.close()
    rows = {b.relpath: b for b in blocks}
    assert len(rows) == len(blocks), "two rows share a file"
    for rel, block in rows.items():
        path = store.root / rel
        assert path.is_file(), f"row {block.key} has no file {rel}"
        data = path.read_bytes()
        assert len(data) == block.nbytes, f"{rel}: {len(data)} bytes, row says {block.nbytes}"
        assert hashlib.sha256(data).hexdigest() == block.checksum, f"{rel}: checksum differs"
        # Content-addressed layout: model folder, key prefix, key and checksum in the name.
        assert rel == store.relpath(
            _namespace_stub(rel, block.namespace), block.key, block.checksum
        )
    files = set(store.iter_relpaths())
    assert files == set(rows), f"files without rows: {sorted(files - set(rows))[:5]}"
    temps = {rel for rel, _ in store.iter_temp_files()} - set(allow_temp)
    assert not temps, f"leftover temporary files: {sorted(temps)[:5]}"
    assert total == sum(b.nbytes for b in blocks)
    if max_bytes is not None:
        assert total <= max_bytes, f"{total} bytes indexed, budget {max_bytes}"
        assert block_files_bytes(cache_dir) <= max_bytes


def _namespace_stub(relpath: str, digest: str) -> NamespaceInfo:
    # The layout check needs only the model folder's name, which the relpath carries.
    folder = relpath.split("/", 1)[0]
    model = folder[: -len(digest[:12]) - 1]
    return NamespaceInfo(digest, model, "", 0, "", 0)


def assert_store_invariants(store: object, index_url: str, max_bytes: int | None = None) -> None:
    """The invariant over any listable store (a folder, a bucket): rows <=> complete
    objects whose bytes match their rows, usage within ``max_bytes``."""
    index = connect_index(index_url, migrate=False)
    try:
        blocks = list(index.iter_blocks())
        total = index.total_bytes()
    finally:
        index.close()
    rows = {b.relpath: b for b in blocks}
    assert len(rows) == len(blocks), "two rows share an object"
    listed = {rel: size for rel, size, _ in store.iter_objects()}  # type: ignore[attr-defined]
    assert set(listed) == set(rows), (
        f"objects without rows: {sorted(set(listed) - set(rows))[:3]}; "
        f"rows without objects: {sorted(set(rows) - set(listed))[:3]}"
    )
    for rel, block in rows.items():
        data = store.read(rel)  # type: ignore[attr-defined]
        assert len(data) == block.nbytes == listed[rel], f"{rel}: size differs from its row"
        assert hashlib.sha256(data).hexdigest() == block.checksum, f"{rel}: checksum differs"
    assert total == sum(b.nbytes for b in blocks)
    if max_bytes is not None:
        assert total <= max_bytes, f"{total} bytes indexed, budget {max_bytes}"
