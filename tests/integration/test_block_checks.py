"""A block is checked like a computed one: import refuses, reads drop, verify reports, and a
restore that cannot use its blocks drops them and recomputes (issue 34, item 4).

Real tiny model, real block files, real SQLite index; the faults are crafted files.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from click.testing import CliRunner
from mlx_lm.models.cache import make_prompt_cache

from omlx.adapters.blockfiles.budget import DiskBudget
from omlx.adapters.blockfiles.format import RawTensor, decode_block, encode_block, pack_block
from omlx.adapters.blockfiles.maintenance import verify
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.blockfiles.writer import BlockWriter
from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.expected_blocks import expected_blocks
from omlx.adapters.mlx.models.loader import load_model
from omlx.adapters.sqlindex import SqlBlockIndex, open_index
from omlx.app.cache_controls import transfer
from omlx.app.cache_controls.transfer import Archive, ImportRefused
from omlx.app.ops.admin import admin_group
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_tier import ColdTier, RecencyBuffer
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION, block_key
from omlx.domain.cache.kv_quant import KVQuant
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.engine_helpers import generate, greedy, submit
from tests.hybrid_models import build_hybrid_model
from tests.storage_checks import record_block

BS = 16


@dataclass
class Model:
    loaded: object
    codec: MLXKVCodec
    namespace: NamespaceInfo


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Model:
    model = load_model(str(tiny_model_dir))
    codec = MLXKVCodec(model.layout)
    codec.expected = expected_blocks(model.model, codec, BS)  # as the model loader wires it
    namespace = replace(model.namespace(BS), block_spec=codec.expected.to_json())
    return Model(model, codec, namespace)


def kv_tensors(tiny: Model, tokens: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's (keys, values) the model computes for ``tokens``, (1, heads, n, dim)."""
    cache = make_prompt_cache(tiny.loaded.model)
    tiny.loaded.model(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    n = len(tokens)
    return [(np.array(c.keys[..., :n, :]), np.array(c.values[..., :n, :])) for c in cache]


def block_file(
    tiny: Model,
    tokens: list[int],
    layers: list[tuple[np.ndarray, np.ndarray]],
    *,
    parent: str | None = None,
    dtype: str = "F32",
    key: str | None = None,
) -> tuple[BlockMeta, bytes]:
    """A block file as ``pack_block`` writes it, for any tokens and tensors (crafted faults)."""
    parent = parent or tiny.namespace.digest
    if key is None:
        key = block_key(parent, tokens)
    meta = BlockMeta(key, parent, tiny.namespace.digest, len(tokens))
    as_np = {"F32": np.float32, "F16": np.float16}[dtype]
    raw = [
        (
            RawTensor(dtype, k.shape, np.ascontiguousarray(k, as_np).tobytes()),
            RawTensor(dtype, v.shape, np.ascontiguousarray(v, as_np).tobytes()),
        )
        for k, v in layers
    ]
    return meta, pack_block(meta, tokens, raw, layer_count=len(tiny.loaded.layout.leaves))


TOKENS = list(range(100, 100 + BS))


def _reshaped(heads: int, dim: int) -> Callable[[Model], tuple[BlockMeta, bytes]]:
    def make(tiny: Model) -> tuple[BlockMeta, bytes]:
        rng = np.random.default_rng(0)
        shape = (1, heads, BS, dim)
        layers = [(rng.standard_normal(shape), rng.standard_normal(shape)) for _ in range(2)]
        return block_file(tiny, TOKENS, layers)

    return make


def _with_nan(tiny: Model) -> tuple[BlockMeta, bytes]:
    layers = kv_tensors(tiny, TOKENS)
    layers[1][1][0, 0, 3, 5] = np.nan
    return block_file(tiny, TOKENS, layers)


def _tokens(tokens: list[int]) -> Callable[[Model], tuple[BlockMeta, bytes]]:
    def make(tiny: Model) -> tuple[BlockMeta, bytes]:
        # Ids outside the vocabulary cannot run through the model: KV of in-range ones.
        layers = kv_tensors(tiny, [t % 300 for t in tokens]) if tokens else _empty(tiny)
        # A negative id has no uint32 key: the file names one of its own.
        key = block_key(tiny.namespace.digest, [t % 2**32 for t in tokens])
        return block_file(tiny, tokens, layers, key=key)

    return make


def _empty(tiny: Model) -> list[tuple[np.ndarray, np.ndarray]]:
    shape = (1, 2, 0, 16)
    return [(np.zeros(shape), np.zeros(shape)) for _ in range(2)]


FAULTS = {
    "wrong head dim": (
        _reshaped(2, 8),
        "its tensor k.0 is shaped [1, 2, 16, 8], the model's [1, 2, 16, 16]",
    ),
    "wrong head count": (_reshaped(3, 16), "its tensor k.0 is shaped [1, 3, 16, 16]"),
    "float16 where float32": (
        lambda tiny: block_file(tiny, TOKENS, kv_tensors(tiny, TOKENS), dtype="F16"),
        "its tensor k.0 is F16, the model's is F32",
    ),
    "NaN": (_with_nan, "its tensor v.1 holds non-finite values"),
    "no layers": (
        lambda tiny: block_file(tiny, TOKENS, []),
        "it lacks the model's tensors k.0, k.1, v.0, v.1",
    ),
    "0 tokens": (_tokens([]), "it holds 0 tokens; a block holds 1 to 16"),
    "too many tokens": (_tokens(list(range(2 * BS))), "it holds 32 tokens; a block holds 1 to 16"),
    "negative token id": (
        _tokens([5, -1, *range(14)]),
        "its token id -1 is outside the vocabulary",
    ),
    "out-of-vocabulary id": (
        _tokens([5, 384, *range(14)]),
        "its token id 384 is outside the vocabulary (0 to 383)",
    ),
}


@dataclass
class Stack:
    index: SqlBlockIndex
    store: FileBlockStore
    writer: BlockWriter
    cold: ColdTier
    cache: PrefixCache


@contextmanager
def stack(tiny: Model, folder: Path, hot_bytes: int = 1 << 30) -> Iterator[Stack]:
    """The cache tiers as the model loader wires them: real files, real SQLite index."""
    index = open_index(folder)
    index.upsert_namespace(tiny.namespace)
    store = FileBlockStore(folder)
    recency = RecencyBuffer(index, interval=0.0)
    writer = BlockWriter(
        store, index, DiskBudget(folder, max_bytes=10**10, reserve_bytes=0), tick_interval=0.01
    )
    cold = ColdTier(
        tiny.namespace,
        store,
        index,
        writer,
        tiny.codec.decode,
        recency=recency,
        check=tiny.codec.check,
    )
    layout = tiny.loaded.layout.domain
    cache = PrefixCache(
        namespace=tiny.namespace, codec=tiny.codec, hot=HotTier(hot_bytes), cold=cold, layout=layout
    )
    try:
        yield Stack(index, store, writer, cold, cache)
    finally:
        writer.close(timeout=10)
        cold.close()
        index.close()


def read_archive(archive: bytes, cache: PrefixCache, tenant: str | None) -> list:
    """``transfer.read_archive`` of archive bytes (the server reads a spooled upload)."""
    with Archive(io.BytesIO(archive)) as opened:
        return transfer.read_archive(opened, cache, tenant, max_blocks=1000)


def archive_of(tiny: Model, blocks: list[tuple[BlockMeta, bytes]]) -> bytes:
    """An export archive holding ``blocks`` as ``export_archive`` lays one out."""
    manifest = {
        "format": "omlx-cache-export",
        "version": 1,
        "cache_format_version": CACHE_FORMAT_VERSION,
        "namespace": tiny.namespace.digest,
        "model": tiny.namespace.model_name,
        "block_size": BS,
        "blocks": [
            {
                "key": meta.key,
                "parent_key": meta.parent_key,
                "token_count": meta.token_count,
                "kind": "kv",
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            for meta, data in blocks
        ],
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in [("manifest.json", json.dumps(manifest).encode())] + [
            (f"blocks/{meta.key}.safetensors", data) for meta, data in blocks
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# --- the spec -----------------------------------------------------------------------------


def test_the_spec_is_what_the_engine_writes_and_a_computed_block_passes(tiny: Model) -> None:
    spec = tiny.codec.expected
    assert spec.block_size == BS and spec.vocab_size == 384  # the tiny model's logits
    assert spec.kinds["kv"].tensors["k.0"] == ("F32", (1, 2, None, 16))
    for n in (1, 5, BS):  # a partial block too
        meta, data = block_file(tiny, TOKENS[:n], kv_tensors(tiny, TOKENS[:n]))
        assert tiny.codec.check(data, meta) is None
    # What the codec cuts from a live cache passes as it is written.
    cache = make_prompt_cache(tiny.loaded.model)
    tiny.loaded.model(mx.array([TOKENS]), cache=cache)
    meta = BlockMeta(block_key(tiny.namespace.digest, TOKENS), tiny.namespace.digest, "ns", BS)
    data = bytes(tiny.codec.encode(tiny.codec.split(cache, 0, BS), TOKENS, meta))
    assert tiny.codec.check(data, meta) is None


# --- import ------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", list(FAULTS))
def test_import_refuses_each_fault_naming_the_block_and_indexes_nothing(
    tiny: Model, tmp_path: Path, fault: str
) -> None:
    make, reason = FAULTS[fault]
    good = block_file(tiny, TOKENS, kv_tensors(tiny, TOKENS))
    bad_meta, bad = make(tiny)
    bad_meta = replace(bad_meta, parent_key=tiny.namespace.digest)
    with stack(tiny, tmp_path) as s:
        assert read_archive(archive_of(tiny, [good]), s.cache, None)  # a sound one imports
        with pytest.raises(ImportRefused) as refused:
            read_archive(archive_of(tiny, [(bad_meta, bad)]), s.cache, None)
        assert str(refused.value).startswith(f"block {bad_meta.key}: ")
        assert reason in str(refused.value)
        assert s.index.block_count() == 0  # read_archive queues nothing; import never ran


def test_values_are_scanned_for_imports_and_verify_not_for_each_read(tiny: Model) -> None:
    meta, data = _with_nan(tiny)
    with_parent = replace(meta, parent_key=tiny.namespace.digest)
    assert "non-finite" in (tiny.codec.check(data, with_parent) or "")
    # A read's file was written here or checked at import: its header is checked again,
    # its bytes are not rescanned (DESIGN's restore-time target).
    assert tiny.codec.check(data, with_parent, values=False) is None
    shaped_meta, shaped = _reshaped(3, 16)(tiny)
    assert "shaped" in (tiny.codec.check(shaped, shaped_meta, values=False) or "")


def test_a_check_reuses_a_read_s_parse_for_that_file_alone(tiny: Model) -> None:
    good_meta, good = block_file(tiny, TOKENS, kv_tensors(tiny, TOKENS))
    bad_meta, bad = _reshaped(3, 16)(tiny)
    tiny.codec.decode(good)  # a read parses the file, then checks it with that parse
    assert "shaped" in (tiny.codec.check(bad, bad_meta, values=False) or "")  # another file
    tiny.codec.decode(bad)
    assert "shaped" in (tiny.codec.check(bad, bad_meta, values=False) or "")  # reused
    assert tiny.codec.check(good, good_meta, values=False) is None


# --- reads and verify on disk ---------------------------------------------------------------


def test_planted_bad_blocks_are_reported_by_verify_and_dropped_by_a_read(
    tiny: Model, tmp_path: Path
) -> None:
    with stack(tiny, tmp_path) as s:
        planted = {}
        for fault in ("wrong head count", "negative token id", "too many tokens"):
            meta, data = FAULTS[fault][0](tiny)
            record_block(s.store, s.index, tiny.namespace, meta, data)
            planted[meta.key] = FAULTS[fault][1]
        good_meta, good = block_file(tiny, TOKENS[:5], kv_tensors(tiny, TOKENS[:5]))
        record_block(s.store, s.index, tiny.namespace, good_meta, good)
        bad = {b.key: problem for b, problem in verify(s.index, s.store)}
        assert set(bad) == set(planted)
        for key, reason in planted.items():
            assert reason in bad[key]
    result = CliRunner().invoke(admin_group, ["cache", "verify", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 1 and "checked 4 blocks: 3 bad" in result.output, result.output
    with stack(tiny, tmp_path) as s:  # a read drops what verify reports (the row, the file)
        for key in planted:
            meta = s.index.get_blocks([key])[key]
            assert s.cold.get(key, meta.parent_key) is None
        assert s.cold.get(good_meta.key, good_meta.parent_key) is not None
        assert set(s.index.get_blocks([*planted, good_meta.key])) == {good_meta.key}
        assert s.cold.stats().corrupt_blocks == 3


# --- restore -----------------------------------------------------------------------------

SYSTEM = "You are a careful coding assistant. " * 6


def prompts(tiny: Model) -> tuple[list[int], list[int]]:
    tok = tiny.loaded.tokenizer

    def chat(user: str) -> list[int]:
        return tok.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            add_generation_prompt=True,
        )

    return chat("List the files."), chat("Write a haiku about caches.")


def together(engine: MLXEngine, a: list[int], b: list[int]) -> tuple[str, str]:
    """Both requests in the engine at once (one batch); their greedy texts."""
    runs = [submit(engine, greedy(a, 12)), submit(engine, greedy(b, 12))]
    for run in runs:
        assert run.done.wait(120)
    deadline = time.monotonic() + 30
    while not all(engine.settled(r.job_id) for r in runs):
        assert time.monotonic() < deadline
        time.sleep(0.002)
    assert all(run.finished.reason for run in runs)  # finished, not failed
    return runs[0].text, runs[1].text


def drain(writer: BlockWriter) -> None:
    """Wait until the writer has filed every queued block."""
    deadline = time.monotonic() + 30
    while writer.pending_keys():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.fixture(scope="module")
def miss_texts(tiny: Model) -> tuple[str, str]:
    """The greedy texts of both prompts without any cache."""
    engine = MLXEngine(tiny.loaded, None, EngineConfig())
    engine.start()
    try:
        a, b = prompts(tiny)
        return generate(engine, greedy(a, 12)).text, generate(engine, greedy(b, 12)).text
    finally:
        engine.stop()


def plant_first_block(tiny: Model, s: Stack, prompt: list[int]) -> str:
    """A block of the wrong head count under the key of ``prompt``'s first block."""
    tokens = prompt[:BS]
    rng = np.random.default_rng(1)
    shape = (1, 3, BS, 16)
    layers = [(rng.standard_normal(shape), rng.standard_normal(shape)) for _ in range(2)]
    meta, data = block_file(tiny, tokens, layers)
    record_block(s.store, s.index, tiny.namespace, meta, data, tokens=tokens)
    return meta.key


def test_a_planted_block_is_dropped_and_the_request_and_its_neighbour_answer_as_a_miss(
    tiny: Model, tmp_path: Path, miss_texts: tuple[str, str]
) -> None:
    a, b = prompts(tiny)
    for _ in ("first start", "after a restart"):  # a fresh process reads the same folder
        with stack(tiny, tmp_path) as s:
            key = plant_first_block(tiny, s, a)
            engine = MLXEngine(tiny.loaded, s.cache, EngineConfig())
            engine.start()
            try:
                assert together(engine, a, b) == miss_texts
            finally:
                engine.stop()
            assert s.cold.stats().corrupt_blocks >= 1
            drain(s.writer)
            # Dropped, then computed again: the row now names the file the engine wrote.
            row = s.index.get_blocks([key]).get(key)
            assert row is None or tiny.codec.check(s.store.read(row.relpath), row) is None
            assert not verify(s.index, s.store)
            s.index.remove_blocks([key])  # for the restart: plant it again


def test_a_restore_that_cannot_use_its_blocks_drops_them_and_recomputes(
    tiny: Model, tmp_path: Path, miss_texts: tuple[str, str]
) -> None:
    """Blocks that reach the join unchecked (here: put straight into RAM) and do not fit
    the model are dropped from RAM and disk; the request and its neighbour are misses."""
    a, b = prompts(tiny)
    with stack(tiny, tmp_path) as s:
        key = plant_first_block(tiny, s, a)  # on disk too: dropped there as well
        data = s.store.read(s.index.get_blocks([key])[key].relpath)
        decoded = tiny.codec.decode(data)
        meta = BlockMeta(key, tiny.namespace.digest, tiny.namespace.digest, BS)
        s.cache._hot.put(meta, decoded.tokens, decoded.payload, decoded.payload.nbytes)
        engine = MLXEngine(tiny.loaded, s.cache, EngineConfig())
        engine.start()
        try:
            assert together(engine, a, b) == miss_texts
            assert s.cache.stats().dropped_restores >= 1  # both share the bad first block
            assert generate(engine, greedy(a, 12)).text == miss_texts[0]  # now a sound hit
        finally:
            engine.stop()
        assert s.cache.stats().hit_tokens > 0
        drain(s.writer)
        row = s.index.get_blocks([key]).get(key)
        assert row is not None and tiny.codec.check(s.store.read(row.relpath), row) is None


def test_decode_checks_a_file_it_was_given_in_another_tensor_order(tiny: Model) -> None:
    """The spec compares tensors by name, not position: any valid order passes."""
    meta, data = block_file(tiny, TOKENS, kv_tensors(tiny, TOKENS))
    tensors, metadata = decode_block(data)
    reordered = encode_block(dict(reversed(list(tensors.items()))), metadata)
    assert tiny.codec.check(bytes(reordered), meta) is None


@pytest.mark.parametrize(
    ("family", "quant"),
    [
        ("gemma3_text", None),  # sliding-window objects
        ("qwen3_next", None),  # state snapshots
        ("gemma3_text", KVQuant(8, 32)),  # quantized blocks (store mode)
        ("gemma3_text", KVQuant(8, 32, mode="exact")),  # head_dim 16: runs in full precision
    ],
)
def test_every_object_a_layout_computes_passes_its_check(
    tmp_path: Path, family: str, quant: KVQuant | None
) -> None:
    """No false refusals: each kind the engine writes, for each layout, fits its spec."""
    model = load_model(str(build_hybrid_model(family, tmp_path / family)))
    codec = MLXKVCodec(model.layout, quant)
    codec.expected = expected_blocks(model.model, codec, BS)
    tokens = list(range(10, 10 + BS))
    cache = make_prompt_cache(model.model)
    model.model(mx.array([tokens]), cache=cache)
    cut = {"kv": codec.split(cache, 0, BS), "window": None, "state": None}
    if model.layout.of("window"):
        cut["window"] = codec.split_window(cache, 0, BS)
    if model.layout.of("state"):
        cut["state"] = codec.snapshot(cache)
    assert set(codec.expected.kinds) == {k for k, p in cut.items() if p is not None}
    for kind, payload in cut.items():
        if payload is None:
            continue
        meta = BlockMeta(block_key("00" * 32, tokens), "00" * 32, "11" * 32, BS, kind)
        assert codec.check(bytes(codec.encode(payload, tokens, meta)), meta) is None, kind
