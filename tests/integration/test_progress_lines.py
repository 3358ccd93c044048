"""Progress of long work, not on a terminal: admin verify/vacuum over many blocks, a long
prefill through the generation service, the weight digest. The results stay the same."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.models.loader import file_sha256, load_model, weights_digest
from omlx.adapters.sqlindex import open_index
from omlx.app.chat.sampling import Sampling
from omlx.app.chat.service import GenerationService
from omlx.app.ops.admin import admin_group
from omlx.app.progress import for_log
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace, record_block

BLOCKS = 150
LINE = re.compile(r"^(verifying blocks|checking index rows|checking block files): [\d,/]+")


def _run(*args: str) -> Result:
    return CliRunner().invoke(admin_group, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def many_blocks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder of BLOCKS real block files and rows, a few rows without files, a few
    files without rows."""
    folder = tmp_path_factory.mktemp("many") / "cache"
    ns = make_namespace("many")
    index, store = open_index(folder), FileBlockStore(folder)
    index.upsert_namespace(ns)
    chain = make_chain(ns, BLOCKS + 3, kv_bytes=64)
    blocks = [
        record_block(store, index, ns, m, d, 1.0 + i) for i, (m, _, d) in enumerate(chain[:BLOCKS])
    ]
    index.close()
    for b in blocks[:2]:
        store.delete(b.relpath)  # rows without files
    for meta, _, data in chain[BLOCKS:]:
        store.write(store.relpath(ns, meta.key, "0" * 64), data)  # files without rows
    return folder


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def test_verify_and_vacuum_print_progress_lines_and_the_same_results(
    many_blocks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet, loud = _copy(many_blocks, tmp_path / "quiet"), _copy(many_blocks, tmp_path / "loud")
    monkeypatch.delenv("OMLX_PROGRESS_INTERVAL", raising=False)
    plain = [_run("cache", cmd, "--cache-dir", str(quiet)) for cmd in ("verify", "vacuum")]
    monkeypatch.setenv("OMLX_PROGRESS_INTERVAL", "0")  # a line per block: every update shows
    shown = [_run("cache", cmd, "--cache-dir", str(loud)) for cmd in ("verify", "vacuum")]

    for a, b in zip(plain, shown, strict=True):
        assert a.exit_code == b.exit_code
        assert a.stdout.replace(str(quiet), "DIR") == b.stdout.replace(str(loud), "DIR")
        assert "\r" not in b.stderr  # CliRunner's stderr is not a terminal: lines, no bar
    assert not any(LINE.match(line) for r in plain for line in r.stderr.splitlines())

    assert f"checked {BLOCKS} blocks: 2 bad" in shown[0].stdout
    verify_lines = [x for x in shown[0].stderr.splitlines() if x.startswith("verifying blocks: ")]
    assert len(verify_lines) == BLOCKS
    assert verify_lines[0].startswith("verifying blocks: 1/150 (0%), ")
    assert verify_lines[-1].startswith("verifying blocks: 150/150 (100%), ")

    assert "removed 2 rows without files" in shown[1].stdout
    assert "removed 3 files without rows" in shown[1].stdout
    lines = shown[1].stderr.splitlines()
    assert any(x.startswith("checking index rows: 150/150 (100%), ") for x in lines)
    files = [x for x in lines if x.startswith("checking block files: ")]
    assert files[-1].startswith(f"checking block files: {BLOCKS - 2 + 3:,}, ")  # total unknown
    assert_cache_invariants(loud)
    assert_cache_invariants(quiet)


def test_clear_counts_the_files_it_deletes(
    many_blocks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _copy(many_blocks, tmp_path / "c")
    monkeypatch.setenv("OMLX_PROGRESS_INTERVAL", "0")
    result = _run("cache", "clear", "--yes", "--cache-dir", str(folder))
    assert "cleared 150 blocks of 1 namespace " in result.stdout
    assert "deleting block files: 150/150 (100%), " in result.stderr


def test_a_long_prefill_logs_its_progress(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OMLX_PROGRESS_INTERVAL", "0")  # a line per 128-token chunk
    model = load_model(str(tiny_model_dir))
    engine = MLXEngine(model, None, EngineConfig(prefill_step_size=128))
    engine.start()
    try:
        svc = GenerationService(engine, model, max_queued=4, default_max_tokens=2)
        rng = random.Random(1)
        long_prompt = [rng.randrange(3, 300) for _ in range(1500)]
        with caplog.at_level(logging.INFO, logger="omlx.app.progress"):
            done = asyncio.run(
                svc.complete(
                    svc.build_request(long_prompt, Sampling(max_tokens=2, temperature=0.0))
                )
            )
            short = asyncio.run(
                svc.complete(
                    svc.build_request(long_prompt[:500], Sampling(max_tokens=2, temperature=0.0))
                )
            )
    finally:
        engine.stop()
    assert done.prompt_tokens == 1500 and short.prompt_tokens == 500
    lines = [r.getMessage() for r in caplog.records if r.name == "omlx.app.progress"]
    name = model.model_id
    first = lines[0].split(" ")[1]  # request numbers are process-wide: whatever this one got
    assert lines[0].startswith(f"request {first} ({name}) prefill: 128/1,500 tokens (8%), ")
    assert lines[-1].startswith(f"request {first} ({name}) prefill: 1,500/1,500 tokens (100%), ")
    # a line per chunk (the last token is left to the first decode step), then the end;
    # none for the 500-token prompt, under PREFILL_MIN_TOKENS
    assert len(lines) == -(-1499 // 128) + 1
    assert all(line.startswith(f"request {first} ") for line in lines)


def test_the_weight_digest_counts_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    files = []
    for i, size in enumerate((5 << 20, 3 << 20)):  # two shards, 8 MiB, read in 4 MiB chunks
        (path := tmp_path / f"model-{i}.safetensors").write_bytes(bytes([i]) * size)
        files.append(path)
    remembered: dict[Path, str] = {}

    def cache(path: Path, compute):
        if path not in remembered:
            remembered[path] = compute(path)
        return remembered[path]

    monkeypatch.setenv("OMLX_PROGRESS_INTERVAL", "0")
    log = logging.getLogger("omlx.test.digest")
    with caplog.at_level(logging.INFO, logger="omlx.test.digest"):
        first = weights_digest(
            files, cache, lambda label, total: for_log(log, label, total, "bytes")
        )
        caplog_first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        again = weights_digest(
            files, cache, lambda label, total: for_log(log, label, total, "bytes")
        )
    assert first == again == weights_digest(files)
    assert set(remembered.values()) == {file_sha256(p) for p in files}
    assert caplog_first[0].startswith("digesting weights: 4.2 MB/8.4 MB (50%), ")
    assert caplog_first[-1].startswith("digesting weights: 8.4 MB/8.4 MB (100%), ")
    # remembered digests count as done at once: the second run reaches the total too
    assert caplog.records[-1].getMessage().startswith("digesting weights: 8.4 MB/8.4 MB (100%)")
