"""The library API (``omlx.cache``) over real folders: the how-to's lifecycle, budget, integrity.

Blocks saved through it are the server's kind of storage: rows in ``index.db`` beside
the server's, files in the model's folder, one budget, one LRU order, checked on every
read and by ``omlx admin cache verify``, listed by ``omlx admin cache stats``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner, Result

from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex import open_index
from omlx.app.ops.admin import admin_group
from omlx.cache import CacheConfig, CacheFactory, PagedSSDCacheManager
from omlx.domain.cache.keys import EXTERNAL
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace, record_block

SRC = Path(__file__).resolve().parents[2] / "src"

# The how-to's "complete working example", folder aside: the lifecycle a user runs first.
EXAMPLE = """
import time
from pathlib import Path
from omlx.cache.factory import CacheConfig, CacheFactory
import mlx.core as mx
import numpy as np

cfg = CacheConfig(
    paged_ssd_cache_dir=Path({cache_dir!r}),
    max_paged_ssd_cache_size=150 * 1024**3,
)
paged_cache = CacheFactory.create_paged_cache(cfg, num_layers=4)
ssd_cache = CacheFactory.create_paged_ssd_cache(cfg, model_name="tiny")
prefix_cache = CacheFactory.create_prefix_cache(
    cfg,
    model=None,
    paged_cache=paged_cache,
    paged_ssd_cache=ssd_cache
)
kv_block = [
    (mx.array(np.random.rand(1, 64, 32)), mx.array(np.random.rand(1, 64, 32))),
    (mx.array(np.random.rand(1, 64, 32)), mx.array(np.random.rand(1, 64, 32))),
]
block_hash = b'\\x00' * 32
prefix_cache.save_block(block_hash, kv_block, token_count=64)
loaded = prefix_cache.load_block(block_hash)
assert loaded is not None
print(f"Restored block with {{len(loaded)}} layers")
for meta in ssd_cache._index.get_all_metadata():
    print(f"Hash: {{meta.block_hash.hex()[:8]}}... Size: {{meta.file_size}} bytes")
"""
# Appended to the example, changing nothing it does: what the second process compares.
KEEP_ARRAYS = """
np.savez({npz!r}, *[np.array(a) for pair in kv_block for a in pair])
"""
# A second process on the same folder: a fresh RAM tier, so the block can only come from disk.
RESTORE = """
import json
import numpy as np
from pathlib import Path
from omlx.cache.factory import CacheConfig, CacheFactory

cfg = CacheConfig(paged_ssd_cache_dir=Path({cache_dir!r}))
ssd_cache = CacheFactory.create_paged_ssd_cache(cfg, model_name="tiny")
prefix_cache = CacheFactory.create_prefix_cache(cfg, paged_ssd_cache=ssd_cache)
before = ssd_cache.stats()
loaded = prefix_cache.load_block(b"\\x00" * 32)
after = ssd_cache.stats()
saved = np.load({npz!r})
same = [
    bool(np.array_equal(np.array(a), saved[f"arr_{{2 * i + j}}"]))
    for i, pair in enumerate(loaded)
    for j, a in enumerate(pair)
]
print(json.dumps({{
    "ram_blocks_before": before["ram"]["blocks"],
    "disk_hits": after["disk"]["hits"] - before["disk"]["hits"],
    "ram_hits": after["ram"]["hits"],
    "layers": len(loaded),
    "pairs": [type(pair).__name__ for pair in loaded],
    "dtype": str(loaded[0][0].dtype),
    "same": same,
}}))
"""


def _python(code: str, tmp_path: Path, name: str) -> str:
    script = tmp_path / name
    script.write_text(textwrap.dedent(code))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _admin(*args: str) -> Result:
    return CliRunner().invoke(admin_group, list(args), catch_exceptions=False)


def _kv(seed: int, layers: int = 2, shape: tuple[int, ...] = (1, 4, 64, 16)) -> list[tuple]:
    rng = np.random.default_rng(seed)
    return [
        (
            mx.array(rng.standard_normal(shape, np.float32)),
            mx.array(rng.standard_normal(shape, np.float32)),
        )
        for _ in range(layers)
    ]


def _same(a: list, b: list) -> bool:
    return all(
        np.array_equal(np.array(x), np.array(y))
        for pa, pb in zip(a, b, strict=True)
        for x, y in zip(pa, pb, strict=True)
    )


def test_the_how_to_example_restores_its_block_and_a_second_process_reads_it_from_disk(
    tmp_path: Path,
) -> None:
    cache_dir, npz = tmp_path / "omlx_ssd_cache", tmp_path / "kv.npz"
    out = _python(
        EXAMPLE.format(cache_dir=str(cache_dir)) + KEEP_ARRAYS.format(npz=str(npz)),
        tmp_path,
        "example.py",
    )
    lines = out.splitlines()
    assert lines[0] == "Restored block with 2 layers"
    assert len(lines) == 2 and lines[1].startswith("Hash: 00000000... Size: ")
    # The server's layout: <dir>/<model>-<namespace[:12]>/<key[:2]>/..., rows in <dir>/index.db.
    (model_dir,) = [p for p in cache_dir.iterdir() if p.is_dir()]
    assert model_dir.name.startswith("tiny-") and len(model_dir.name) == len("tiny-") + 12
    assert (cache_dir / "index.db").is_file()

    report = json.loads(
        _python(RESTORE.format(cache_dir=str(cache_dir), npz=str(npz)), tmp_path, "restore.py")
    )
    assert report["ram_blocks_before"] == 0 and report["disk_hits"] == 1 and report["ram_hits"] == 0
    assert report["layers"] == 2 and report["pairs"] == ["tuple", "tuple"]
    assert report["dtype"] == "mlx.core.float32" and report["same"] == [True] * 4
    assert_cache_invariants(cache_dir, 150 * 1024**3)


def test_blocks_survive_a_restart_on_either_index(tmp_path: Path, index_url: str) -> None:
    block = _kv(1)
    cfg = CacheConfig(paged_ssd_cache_dir=tmp_path, index_url=index_url, block_size=16)
    with CacheFactory.create_paged_ssd_cache(cfg, model_name="org/Model Q8") as ssd:
        ssd.save_block(b"a" * 32, block, token_count=16)
        assert ssd.has_block(b"a" * 32) and ssd.load_block(b"a" * 32) is not None
    with CacheFactory.create_paged_ssd_cache(cfg, model_name="org/Model Q8") as ssd:
        assert len(ssd.ram) == 0
        assert _same(ssd.load_block(b"a" * 32), block) and ssd.stats()["disk"]["hits"] == 1
        (meta,) = ssd.list_blocks()
        assert (meta.block_hash, meta.token_count) == (b"a" * 32, 16)
        assert meta.path.parent.parent == ssd.model_dir and ssd.model_dir.name.startswith(
            "org-Model-Q8-"
        )
        assert meta.path.stat().st_size == meta.file_size and meta.hit_count >= 1
        assert ssd.load_block(b"b" * 32) is None
    # Another block size is another namespace: nothing shared.
    with PagedSSDCacheManager(
        tmp_path, model_name="org/Model Q8", block_size=32, index_url=index_url
    ) as ssd:
        assert ssd.load_block(b"a" * 32) is None and ssd.list_blocks() == []
    assert_cache_invariants(tmp_path, index_url=index_url)


def test_hot_cache_only_makes_no_file_and_starts_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    threads = set(threading.enumerate())
    ssd = PagedSSDCacheManager(
        cache_dir=None, max_size_bytes=0, hot_cache_max_bytes=4 * 1024**3, hot_cache_only=True
    )
    also = PagedSSDCacheManager(cache_dir=tmp_path / "ignored", hot_cache_only=True)
    block = _kv(2)
    ssd.save_block(b"h" * 32, block, token_count=64)
    also.save_block(b"h" * 32, block, token_count=64)
    assert _same(ssd.load_block(b"h" * 32), block) and ssd.load_block(b"x" * 32) is None
    assert ssd.list_blocks() == [] and ssd._index.get_all_metadata() == [] and ssd.flush()
    assert set(threading.enumerate()) == threads
    assert list(tmp_path.iterdir()) == []
    assert ssd.cache_dir is None and "disk" not in ssd.stats()
    # No folder configured: the factory gives no SSD tier and the prefix cache keeps RAM only.
    cfg = CacheConfig(hot_cache_max_size="1MB")
    assert CacheFactory.create_paged_ssd_cache(cfg, model_name="tiny") is None
    paged = CacheFactory.create_paged_cache(cfg, num_layers=2)
    prefix = CacheFactory.create_prefix_cache(cfg, paged_cache=paged)
    prefix.save_block(b"p" * 32, block, token_count=64)
    assert _same(prefix.load_block(b"p" * 32), block) and prefix.list_blocks() == []
    assert len(paged) == 1 and paged.max_bytes == 10**6  # the paged cache is the RAM tier
    assert set(threading.enumerate()) == threads and list(tmp_path.iterdir()) == []


def test_the_ram_tier_keeps_to_its_budget_least_recently_used_out_first() -> None:
    one = sum(a.nbytes for pair in _kv(0) for a in pair)
    ssd = PagedSSDCacheManager(hot_cache_max_bytes=2 * one + one // 2, hot_cache_only=True)
    for i in range(3):
        ssd.save_block(bytes([i]) * 32, _kv(i), token_count=64)
        if i == 1:
            ssd.load_block(bytes([0]) * 32)  # block 0 is used again: block 1 goes first
    assert ssd.load_block(bytes([1]) * 32) is None
    assert (
        ssd.load_block(bytes([0]) * 32) is not None and ssd.load_block(bytes([2]) * 32) is not None
    )
    assert ssd.stats()["ram"]["bytes"] <= ssd.ram.max_bytes


def _file_size(tmp_path: Path, block: list) -> int:
    with PagedSSDCacheManager(tmp_path / "scratch", model_name="probe") as ssd:
        ssd.save_block(b"s" * 32, block, token_count=64)
        return ssd.list_blocks()[0].file_size


def test_the_budget_and_lru_order_span_the_server_s_blocks_and_these(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    ns = make_namespace("served-model")
    index, store = open_index(cache_dir), FileBlockStore(cache_dir)
    index.upsert_namespace(ns)
    ((meta, _, data),) = make_chain(ns, 1)
    server_block = record_block(store, index, ns, meta, data, at=1.0)  # used long ago
    index.close()
    size = _file_size(tmp_path, _kv(0))
    budget = 3 * size + size // 2
    a, b, c, d = (bytes([n]) * 32 for n in b"abcd")
    with PagedSSDCacheManager(cache_dir, max_size_bytes=budget, model_name="lib") as ssd:
        for i, h in enumerate((a, b, c)):
            ssd.save_block(h, _kv(i), token_count=64)
        assert [m.block_hash for m in ssd.list_blocks()] == [a, b, c]
        assert ssd.load_block(a) is not None  # a RAM hit, and the disk's LRU order sees it
        assert [m.block_hash for m in ssd.list_blocks()] == [b, c, a]
        ssd.save_block(d, _kv(3), token_count=64)
        # Room for d: the server's old block went first, then b, the least recently used.
        assert [m.block_hash for m in ssd.list_blocks()] == [c, a, d]
        assert ssd.stats()["writer"]["evicted_blocks"] == 2
    reopened = open_index(cache_dir)
    assert reopened.get_blocks([server_block.key]) == {} and reopened.total_bytes() <= budget
    reopened.close()
    with PagedSSDCacheManager(cache_dir, max_size_bytes=budget, model_name="lib") as ssd:
        assert ssd.load_block(b) is None and _same(ssd.load_block(a), _kv(0))
    assert_cache_invariants(cache_dir, budget)


def test_a_block_larger_than_the_budget_is_kept_in_ram_only(tmp_path: Path) -> None:
    with PagedSSDCacheManager(tmp_path, max_size_bytes=1000, model_name="lib") as ssd:
        ssd.save_block(b"big" * 10, _kv(0), token_count=64)
        assert ssd.list_blocks() == [] and ssd.stats()["writer"]["dropped_no_space"] == 1
        assert ssd.load_block(b"big" * 10) is not None  # RAM still serves it
    assert_cache_invariants(tmp_path, 1000)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # inside the last tensor
    path.write_bytes(bytes(data))


def test_a_corrupt_block_is_refused_and_removed_and_admin_verify_flags_it(tmp_path: Path) -> None:
    good, bad = _kv(5), _kv(6)
    with PagedSSDCacheManager(tmp_path, model_name="lib") as ssd:
        ssd.save_block(b"g" * 32, good, token_count=64)
        ssd.save_block(b"b" * 32, bad, token_count=64)
        paths = {m.block_hash: m.path for m in ssd.list_blocks()}
    result = _admin("cache", "verify", "--cache-dir", str(tmp_path))
    assert result.exit_code == 0 and "checked 2 blocks: 0 bad" in result.output

    _flip_a_byte(paths[b"b" * 32])
    result = _admin("cache", "verify", "--cache-dir", str(tmp_path))
    assert result.exit_code == 1 and "checked 2 blocks: 1 bad" in result.output
    assert (
        f"BAD {paths[b'b' * 32].name.split('.')[0]}" in result.output
        and "checksum" in result.output
    )

    with PagedSSDCacheManager(tmp_path, model_name="lib") as ssd:
        assert ssd.load_block(b"b" * 32) is None  # never served
        assert ssd.stats()["disk"]["corrupt_blocks"] == 1
        assert not paths[b"b" * 32].exists() and [m.block_hash for m in ssd.list_blocks()] == [
            b"g" * 32
        ]
        assert _same(ssd.load_block(b"g" * 32), good)
    assert (
        "checked 1 blocks: 0 bad" in _admin("cache", "verify", "--cache-dir", str(tmp_path)).output
    )
    assert_cache_invariants(tmp_path)


def test_admin_verify_flags_a_row_whose_key_does_not_follow_from_its_hash(tmp_path: Path) -> None:
    with PagedSSDCacheManager(tmp_path, model_name="lib") as ssd:
        ssd.save_block(b"k" * 32, _kv(7), token_count=64)
        ssd.save_block(b"l" * 32, _kv(8), token_count=64)
        (first, _) = ssd.list_blocks()
    index = open_index(tmp_path)
    with index.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE blocks SET parent_key = ? WHERE key = ?", ((b"z" * 32).hex(), first.key)
        )
    index.close()
    result = _admin("cache", "verify", "--cache-dir", str(tmp_path))
    assert result.exit_code == 1 and "1 bad" in result.output
    assert f"BAD {first.key}" in result.output and "caller's hash" in result.output


def test_admin_stats_lists_the_library_s_model(tmp_path: Path) -> None:
    with PagedSSDCacheManager(tmp_path, model_name="my-loop-model", block_size=32) as ssd:
        for i in range(3):
            ssd.save_block(bytes([i + 1]) * 16, _kv(i), token_count=32 - i)
        ssd.flush()
        files = sum(m.file_size for m in ssd.list_blocks())
    text = _admin("cache", "stats", "--cache-dir", str(tmp_path)).output
    assert "my-loop-model [" in text and "3 blocks, 93 tokens" in text
    report = json.loads(_admin("cache", "stats", "--cache-dir", str(tmp_path), "--json").output)
    (ns,) = report["namespaces"]
    assert (ns["model_name"], ns["blocks"], ns["tokens"], ns["nbytes"]) == (
        "my-loop-model",
        3,
        93,
        files,
    )
    assert ns["block_size"] == 32
    index = open_index(tmp_path)
    assert {b.kind for b in index.iter_blocks()} == {EXTERNAL}
    index.close()


def test_a_second_owner_of_the_folder_is_refused_clearly(tmp_path: Path) -> None:
    with (
        PagedSSDCacheManager(tmp_path, model_name="lib"),
        pytest.raises(RuntimeError, match="in use by process"),
    ):
        PagedSSDCacheManager(tmp_path, model_name="other")
    with PagedSSDCacheManager(tmp_path, model_name="other") as ssd:  # free again after close
        assert ssd.list_blocks() == []


def test_the_docs_example_is_the_script_and_prints_what_the_docs_show(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "library.md").read_text()
    script = (root / "docs" / "library_example.py").read_text()
    shown = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert shown == script.split('"""', 2)[2].lstrip("\n")
    console = page.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    runs = [i for i, line in enumerate(console) if line.startswith("$ .venv/bin/python")]
    expected = [console[runs[0] + 1 : runs[1]], console[runs[1] + 1 : runs[1] + 3]]
    folder = tmp_path / "demo"
    for want in expected:
        done = subprocess.run(
            [sys.executable, str(root / "docs" / "library_example.py"), str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == want
    assert_cache_invariants(folder)
