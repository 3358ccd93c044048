"""Image rows on the SSD tier: real safetensors files, the real writer thread, a real SQLite index.

Rows written by one "server" are read back by the next (bf16 and float32 alike, bit for
bit), show in the ``image_rows`` view, count in the cold tier's budget, are evicted with
the blocks, pass ``omlx admin cache verify`` and are refused there and on read when a
file was tampered with.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from omlx.adapters.blockfiles.maintenance import verify
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.blockfiles.writer import BlockWriter
from omlx.adapters.mlx.vision.rows_codec import MLXRowsCodec
from omlx.adapters.sqlindex import open_index
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.image_rows import ImageRowsTiers
from omlx.domain.cache.keys import IMAGE
from tests.integration.test_cold_tier import cold_tier
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace

DIGEST, OTHER = "ab" * 32, "cd" * 32


def _drain(writer: BlockWriter) -> None:
    deadline = time.monotonic() + 10
    while writer.pending_keys() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not writer.pending_keys()


def _rows(n: int, seed: int, dtype=mx.bfloat16) -> mx.array:
    return mx.array(np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)).astype(
        dtype
    )


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_rows_written_by_one_server_are_read_back_by_the_next(tmp_path: Path, dtype) -> None:
    ns = make_namespace("org/Tiny VLM")
    rows = _rows(5, 1, dtype)
    with cold_tier(tmp_path, ns) as (tier, writer, _, _):
        tiers = ImageRowsTiers(ns.digest, MLXRowsCodec(), HotTier(1 << 20), tier)
        tiers.put(DIGEST, "acme", rows)
        _drain(writer)
    assert_cache_invariants(tmp_path)
    with sqlite3.connect(tmp_path / "index.db") as db:
        shown = db.execute(
            "SELECT model_name, digest, tenant, row_count, hidden_size, dtype, nbytes,"
            " last_used_utc FROM image_rows"
        ).fetchall()
        usage = db.execute("SELECT image_objects, image_bytes, nbytes FROM cache_usage").fetchall()
    name = "BF16" if dtype == mx.bfloat16 else "F32"
    ((model, digest, tenant, count, hidden, stored, nbytes, used),) = shown
    assert (model, digest, tenant, count, hidden, stored) == (
        ns.model_name,
        DIGEST,
        "acme",
        5,
        8,
        name,
    )
    assert usage == [(1, nbytes, nbytes)] and nbytes > rows.nbytes and used
    with cold_tier(tmp_path, ns) as (tier, _, _, _):
        tiers = ImageRowsTiers(ns.digest, MLXRowsCodec(), HotTier(1 << 20), tier)
        assert tiers.get(DIGEST, None) is None  # another tenant's rows are not the default's
        back = tiers.get(DIGEST, "acme")
        assert back is not None and back.dtype == dtype and back.shape == (5, 8)
        assert mx.array_equal(back, rows).item()
        assert tiers.stats().ssd_hits == 1
    assert verify(open_index(tmp_path), FileBlockStore(tmp_path)) == []


def test_a_tampered_rows_file_is_refused_by_verify_and_on_read(tmp_path: Path) -> None:
    ns = make_namespace()
    with cold_tier(tmp_path, ns) as (tier, writer, index, _):
        tiers = ImageRowsTiers(ns.digest, MLXRowsCodec(), HotTier(1 << 20), tier)
        tiers.put(DIGEST, None, _rows(3, 2))
        _drain(writer)
        (row,) = [b for b in index.iter_blocks() if b.kind == IMAGE]
    path = tmp_path / row.relpath
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last row
    path.write_bytes(bytes(data))
    ((bad, why),) = verify(open_index(tmp_path), FileBlockStore(tmp_path))
    assert bad.key == row.key and why == "checksum mismatch"
    with cold_tier(tmp_path, ns) as (tier, _, index, _):
        tiers = ImageRowsTiers(ns.digest, MLXRowsCodec(), HotTier(1 << 20), tier)
        assert tiers.get(DIGEST, None) is None  # removed, row first, never served
        assert index.get_blocks([row.key]) == {}
    assert not path.exists()
    assert_cache_invariants(tmp_path)


def test_rows_count_in_the_cold_budget_and_are_evicted_lru_with_the_blocks(tmp_path: Path) -> None:
    ns = make_namespace()
    chain = make_chain(ns, 3)
    with cold_tier(tmp_path, ns) as (tier, writer, index, clock):
        tiers = ImageRowsTiers(ns.digest, MLXRowsCodec(), HotTier(1 << 20), tier)
        tiers.put(DIGEST, None, _rows(16, 3))
        _drain(writer)
        image_bytes = index.total_bytes()
    block_bytes = sum(len(data) for _, _, data in chain)
    budget = image_bytes + block_bytes - 1  # one byte short of holding them all
    with cold_tier(tmp_path, ns, max_bytes=budget) as (tier, writer, index, clock):
        for meta, tokens, data in chain:
            clock.advance()
            tier.put(meta, tokens, data)
            _drain(writer)
        kinds = sorted(b.kind for b in index.iter_blocks())
        assert kinds == ["kv"] * 3  # the least recently used object, the image's rows, went
        assert index.total_bytes() <= budget
    with sqlite3.connect(tmp_path / "index.db") as db:
        assert db.execute("SELECT COUNT(*) FROM images").fetchone() == (0,)
    assert_cache_invariants(tmp_path, max_bytes=budget)
