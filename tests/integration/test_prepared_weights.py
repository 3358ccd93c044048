"""A GGUF dequantized on the CPU is kept as a float32 copy, and the next load reads it instead."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner

from omlx.adapters.mlx.models import prepared as prepared_module
from omlx.adapters.mlx.models.gguf import load_gguf
from omlx.adapters.mlx.models.loader import load_model
from omlx.adapters.mlx.models.prepared import MANIFEST, PREPARED_DIR, WEIGHTS_FILE, PreparedWeights
from omlx.app.chat.sampling import Sampling
from omlx.app.models import chores, pool
from omlx.app.ops.admin import admin_group
from omlx.app.settings import load_settings
from omlx.app.wiring.bootstrap import bootstrap
from tests.tiny_gguf import write_tiny_gguf

CHAT = [{"role": "user", "content": "The quick brown fox"}]


def _admin(*args: str):
    return CliRunner().invoke(admin_group, list(args), catch_exceptions=False)


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path)
    return path


def _logits(model, tokenizer) -> mx.array:
    return model(mx.array([tokenizer.encode("The quick brown fox jumps")]))


def test_the_copy_loads_the_very_model_the_gguf_gives(gguf_file: Path, tmp_path: Path) -> None:
    store = PreparedWeights(tmp_path / "prepared", max_bytes=10**9)

    first = load_model(str(gguf_file), prepared=store)
    write = first.extra.pop("write_prepared_copy")
    folder = write(lambda: True)
    assert folder is not None and (folder / MANIFEST).is_file()
    second = load_model(str(gguf_file), prepared=store)

    assert "write_prepared_copy" not in second.extra  # read from the copy: nothing to write
    assert second.config == first.config
    assert second.namespace(64) == first.namespace(64)  # the same cache namespace: KV reused
    assert second.tokenizer.eos_token_ids == first.tokenizer.eos_token_ids == {2}
    assert second.tokenizer.encode("The quick brown fox") == first.tokenizer.encode(
        "The quick brown fox"
    )
    assert second.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True) == (
        first.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    )
    assert mx.array_equal(
        _logits(second.model, second.tokenizer), _logits(first.model, first.tokenizer)
    ).item()
    manifest = json.loads((folder / MANIFEST).read_text())
    assert (
        manifest["source"] == str(gguf_file)
        and manifest["weights_bytes"] == (folder / WEIGHTS_FILE).stat().st_size
    )


def test_the_budget_keeps_the_most_recently_loaded_copies(tmp_path: Path) -> None:
    files = []
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        write_tiny_gguf(tmp_path / name / "tiny.gguf")
        files.append(tmp_path / name / "tiny.gguf")
    one = sum(w.nbytes for w in load_gguf(files[0]).weights.values())
    store = PreparedWeights(tmp_path / "prepared", max_bytes=int(2.5 * one))

    folders = [store.keep(f"{i}" * 64, load_gguf(path), path) for i, path in enumerate(files[:2])]
    old = time.time() - 100
    os.utime(folders[1] / MANIFEST, (old, old))  # b loaded longest ago, a since
    assert store.load("0" * 64) is not None
    store.keep("2" * 64, load_gguf(files[2]), files[2])

    assert sorted(c.path.name[:1] for c in store.copies()) == ["0", "2"]
    assert sum(c.nbytes for c in store.copies()) <= store.max_bytes


def test_a_copy_larger_than_the_budget_is_not_written(gguf_file: Path, tmp_path: Path) -> None:
    store = PreparedWeights(tmp_path / "prepared", max_bytes=1000)
    assert store.keep("d" * 64, load_gguf(gguf_file), gguf_file) is None
    assert store.copies() == []


def test_an_unreadable_copy_is_removed_and_the_gguf_loads_instead(
    gguf_file: Path, tmp_path: Path
) -> None:
    store = PreparedWeights(tmp_path / "prepared", max_bytes=10**9)
    first = load_model(str(gguf_file), prepared=store)
    folder = first.extra.pop("write_prepared_copy")(lambda: True)
    weights = folder / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a torn file

    again = load_model(str(gguf_file), prepared=store)

    assert not folder.exists()
    assert "write_prepared_copy" in again.extra  # dequantized again, so it offers a new copy
    assert mx.array_equal(
        _logits(again.model, again.tokenizer), _logits(first.model, first.tokenizer)
    ).item()


def test_an_abandoned_or_crashed_write_leaves_nothing_that_loads(
    gguf_file: Path, tmp_path: Path
) -> None:
    root = tmp_path / "prepared"
    store = PreparedWeights(root, max_bytes=10**9)
    loaded = load_gguf(gguf_file)
    calls = []
    assert (
        store.keep(
            "e" * 64, loaded, gguf_file, proceed=lambda: not calls.append(1) and len(calls) <= 3
        )
        is None
    )
    assert list(root.iterdir()) == []  # nothing of the abandoned write
    assert store.load("e" * 64) is None

    stale, fresh = root / ".tmp-stale-1", root / ".tmp-fresh-2"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / WEIGHTS_FILE).write_bytes(b"half")
    old = time.time() - prepared_module.STALE_TEMP_SECONDS - 10
    os.utime(stale, (old, old))
    PreparedWeights(root, max_bytes=10**9)  # a start
    assert not stale.exists()
    assert fresh.exists()  # maybe another server's write under way


def test_the_server_writes_the_copy_when_quiet_and_the_next_start_loads_it(
    gguf_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(chores, "_QUIET_BEFORE_CHORES_S", 0.3)
    monkeypatch.setattr(pool, "IN_USE_GRACE_S", 0.3)
    settings = load_settings(
        env={}, flags={"model": str(gguf_file), "paged_ssd_cache_dir": str(tmp_path / "cache")}
    )
    copies = tmp_path / "cache" / PREPARED_DIR

    def reply() -> tuple[str, int]:
        container = bootstrap(settings)
        try:
            served = container.pool.loaded()[0]
            g = served.generation
            request = g.build_request(
                g.encode_text("The quick brown fox"), Sampling(max_tokens=6, temperature=0)
            )
            result = asyncio.run(g.complete(request))
            deadline = time.monotonic() + 30
            while not any(copies.glob(f"*/{MANIFEST}")) and time.monotonic() < deadline:
                time.sleep(0.1)
            return result.text, result.completion_tokens
        finally:
            container.close()

    with caplog.at_level(logging.INFO, logger="omlx.adapters.mlx.models.prepared"):
        first = reply()
        assert any("wrote the prepared float32 copy" in r.message for r in caplog.records)
        caplog.clear()
        second = reply()
    assert any("loaded the prepared float32 copy" in r.message for r in caplog.records)
    assert second == first
    # The block files' reconcile, verify and stats leave the copy alone and count it.
    assert len(list(copies.glob(f"*/{MANIFEST}"))) == 1
    cache = str(tmp_path / "cache")
    assert _admin("cache", "verify", "--cache-dir", cache).exit_code == 0
    report = json.loads(_admin("cache", "stats", "--json", "--cache-dir", cache).stdout)
    assert report["prepared_weights"]["copies"] == 1
    assert (
        report["prepared_weights"]["nbytes"]
        > (next(copies.glob(f"*/{WEIGHTS_FILE}"))).stat().st_size
    )
    assert (
        "prepared:     1 float32 GGUF copies"
        in _admin("cache", "stats", "--cache-dir", cache).output
    )
    assert len(list(copies.glob(f"*/{MANIFEST}"))) == 1


def test_an_unload_during_the_wait_stops_the_writer(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chores, "_QUIET_BEFORE_CHORES_S", 60.0)
    settings = load_settings(
        env={}, flags={"model": str(gguf_file), "paged_ssd_cache_dir": str(tmp_path / "cache")}
    )
    container = bootstrap(settings)
    started = time.monotonic()
    container.close()  # unloads: its closer stops the waiting writer and joins it
    assert time.monotonic() - started < 10
    assert not any((tmp_path / "cache" / PREPARED_DIR).glob(f"*/{MANIFEST}"))


def test_a_copy_another_server_finished_first_is_kept(
    gguf_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PreparedWeights(tmp_path / "prepared", max_bytes=10**9)
    loaded = load_gguf(gguf_file)
    real_rename = os.rename

    def the_other_server_renames_first(src, dst):
        real_rename(src, dst)  # its own, identical copy lands first ...
        raise OSError(39, "Directory not empty")  # ... so ours cannot

    monkeypatch.setattr(prepared_module.os, "rename", the_other_server_renames_first)
    assert store.keep("a" * 64, loaded, gguf_file) == store.folder("a" * 64)
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "prepared").iterdir()] == [store.folder("a" * 64).name]
    assert store.load("a" * 64) is not None
