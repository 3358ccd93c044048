"""Block files: the safetensors format against the reference reader/writer, the store, the lock."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from omlx.adapters.blockfiles.format import (
    RawTensor,
    decode_block,
    encode_block,
    kv_layers,
    pack_block,
    read_tokens,
    tokens_tensor,
    unpack_block,
)
from omlx.adapters.blockfiles.lock import CacheDirLock, CacheDirLocked, is_locked, lock_holder
from omlx.adapters.blockfiles.store import FileBlockStore, key_of, safe_folder_name
from omlx.adapters.sqlindex import open_index
from omlx.domain.cache.blocks import BlockMeta, StoredBlock
from tests.storage_checks import assert_cache_invariants, make_chain, make_namespace

SRC = Path(__file__).resolve().parents[2] / "src"

# --- format --------------------------------------------------------------------------


def _raw(array: np.ndarray, dtype: str) -> RawTensor:
    return RawTensor(
        dtype, tuple(array.shape), array.astype(array.dtype.newbyteorder("<")).tobytes()
    )


def test_our_files_load_with_safetensors(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {
        "tokens": np.arange(7, dtype=np.int32),
        "k.0": rng.standard_normal((1, 2, 7, 3)).astype(np.float32),
        "v.0": rng.standard_normal((1, 2, 7, 3)).astype(np.float16),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    dtypes = {np.int32: "I32", np.float32: "F32", np.float16: "F16"}
    tensors = {name: _raw(a, dtypes[a.dtype.type]) for name, a in arrays.items()}
    data = encode_block(tensors, {"key": "abc", "token_count": "7"})

    (header_len,) = struct.unpack("<Q", data[:8])
    assert (8 + header_len) % 8 == 0  # data section 8-byte aligned, header padded with spaces
    loaded = st_load(bytes(data))  # encode_block returns a bytearray
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
        assert loaded[name].dtype == array.dtype
    path = tmp_path / "b.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"key": "abc", "token_count": "7"}


def test_safetensors_files_decode() -> None:
    arrays: dict[str, np.ndarray] = {
        "b": np.arange(6, dtype=np.int64).reshape(2, 3),
        "a": np.ones(5, dtype=np.float32),
    }
    data = st_save(arrays, metadata={"format_version": "1"})
    tensors, metadata = decode_block(data)
    assert metadata == {"format_version": "1"}
    assert tensors["b"].dtype == "I64" and tensors["b"].shape == (2, 3)
    np.testing.assert_array_equal(
        np.frombuffer(tensors["b"].data, np.int64).reshape(2, 3), arrays["b"]
    )
    np.testing.assert_array_equal(np.frombuffer(tensors["a"].data, np.float32), arrays["a"])


def test_bf16_stays_bf16(tmp_path: Path) -> None:
    bits = np.array([0x3F80, 0xC000, 0x0000], dtype=np.uint16)  # 1.0, -2.0, 0.0 in bfloat16
    data = encode_block({"k.0": RawTensor("BF16", (3,), bits.tobytes())}, {})
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(data)
    with safe_open(str(path), framework="numpy") as f:
        assert f.get_slice("k.0").get_dtype() == "BF16"
    tensors, _ = decode_block(data)
    assert tensors["k.0"].dtype == "BF16" and bytes(tensors["k.0"].data) == bits.tobytes()


def test_pack_unpack_block_round_trip() -> None:
    ns = make_namespace()
    meta, tokens, data = make_chain(ns, 1)[0]
    got_tokens, tensors, metadata = unpack_block(data)
    assert got_tokens == tokens
    layers = kv_layers(tensors, metadata)
    assert [leaf for leaf, _, _ in layers] == list(range(ns.layer_count))
    assert metadata["kind"] == "kv" and metadata["format_version"] == "2"
    assert metadata["key"] == meta.key and metadata["parent_key"] == meta.parent_key
    assert metadata["layer_count"] == str(ns.layer_count)
    assert set(decode_block(data)[0]) == {"tokens", "k.0", "v.0", "k.1", "v.1"}
    assert read_tokens(tokens_tensor([0, 1, 2**31 - 1])) == (0, 1, 2**31 - 1)
    with pytest.raises(ValueError):
        pack_block(meta, tokens[:-1], [])
    # a file of the older format is refused, never misread
    tensors_all, old_meta = decode_block(data)
    with pytest.raises(ValueError, match="format version"):
        unpack_block(encode_block(tensors_all, {**old_meta, "format_version": "1"}))
    with pytest.raises(ValueError, match="leaves"):
        unpack_block(encode_block(tensors_all, {**old_meta, "leaves": "0"}))


def _mutations() -> list[bytes]:
    good = encode_block(
        {"t": RawTensor("I32", (2,), b"\x01\x00\x00\x00\x02\x00\x00\x00")}, {"a": "b"}
    )
    hlen = struct.unpack("<Q", good[:8])[0]

    def with_header(header: object, body: bytes = b"\x00" * 8) -> bytes:
        raw = json.dumps(header).encode()
        return struct.pack("<Q", len(raw)) + raw + body

    return [
        b"",
        good[:5],
        good[:-1],  # truncated data
        good + b"\x00",  # trailing bytes
        struct.pack("<Q", hlen + 100) + good[8:],  # header length past the end
        struct.pack("<Q", 2**60) + good[8:],
        good[:8] + b"[" + good[9:],  # not JSON
        with_header([1, 2]),
        with_header({"t": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}),
        with_header({"t": {"dtype": "I32", "shape": [3], "data_offsets": [0, 8]}}),
        with_header({"t": {"dtype": "I32", "shape": [-2], "data_offsets": [0, 8]}}),
        with_header({"t": {"dtype": "I32", "shape": [2], "data_offsets": [0, 9]}}),
        with_header({"t": {"dtype": "I32", "shape": [1], "data_offsets": [4, 8]}}),  # gap
        with_header(
            {
                "t": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
                "u": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
            }
        ),  # overlap
        with_header(
            {"__metadata__": {"a": 1}, "t": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}}
        ),
        with_header({"t": "nope"}),
    ]


@pytest.mark.parametrize("data", _mutations())
def test_malformed_bytes_raise_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_block(data)


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(0, 2000), flip=st.integers(0, 2000), junk=st.binary(max_size=64))
def test_damaged_files_only_ever_raise_value_error(cut: int, flip: int, junk: bytes) -> None:
    _, _, data = make_chain(make_namespace(), 1, kv_bytes=64)[0]
    damaged = bytearray(data[: cut % (len(data) + 1)] + junk)
    if damaged:
        damaged[flip % len(damaged)] ^= 0xFF
    with contextlib.suppress(ValueError):
        unpack_block(bytes(damaged))


# --- store ---------------------------------------------------------------------------


def test_layout_and_folder_names(tmp_path: Path) -> None:
    ns = make_namespace("HuggingFaceTB/SmolLM2 135M:q8")
    store = FileBlockStore(tmp_path)
    key = "ab" + "c" * 62
    checksum = hashlib.sha256(b"one").hexdigest()
    assert (
        store.relpath(ns, key, checksum)
        == f"HuggingFaceTB-SmolLM2-135M-q8-{ns.digest[:12]}/ab/{key}.{checksum[:12]}.safetensors"
    )
    assert safe_folder_name("../..") == "model"
    assert safe_folder_name("x" * 200) == "x" * 64
    other = make_namespace("HuggingFaceTB/SmolLM2 135M:q8", quant="q4")
    # Two quantizations never share; two versions of one key's bytes never share either.
    assert store.relpath(other, key, checksum) != store.relpath(ns, key, checksum)
    assert store.relpath(ns, key, hashlib.sha256(b"two").hexdigest()) != store.relpath(
        ns, key, checksum
    )
    assert key_of(store.relpath(ns, key, checksum)) == key
    assert key_of(f"m-{ns.digest[:12]}/ab/{key}.safetensors") == key  # the layout before
    for bad in ("../x.safetensors", "/etc/passwd", ""):
        with pytest.raises(ValueError):
            store.path(bad)
    for bad_checksum in ("", "xyz" * 20, checksum[:8]):
        with pytest.raises(ValueError):
            store.relpath(ns, key, bad_checksum)


def test_durable_write_read_delete(tmp_path: Path) -> None:
    ns = make_namespace()
    store, index = FileBlockStore(tmp_path), open_index(tmp_path)
    index.upsert_namespace(ns)
    for meta, _, data in make_chain(ns, 5):
        rel = store.relpath(ns, meta.key, hashlib.sha256(data).hexdigest())
        store.write(rel, data)
        assert store.read(rel) == data
        index.add_block(_row(meta, rel, data))
    extra = make_chain(ns, 1, seed=9)[0]
    rel = store.relpath(ns, extra[0].key, hashlib.sha256(extra[2]).hexdigest())
    store.write(rel, extra[2])
    store.delete(rel)
    store.delete(rel)  # a missing file is not an error
    with pytest.raises(FileNotFoundError):
        store.read(rel)
    (tmp_path / "stray.txt").write_text("not a block")
    assert len(list(store.iter_relpaths())) == 5
    index.close()
    assert_cache_invariants(tmp_path)


def test_failed_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = make_namespace()
    store = FileBlockStore(tmp_path)
    meta, _, data = make_chain(ns, 1)[0]

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("omlx.adapters.blockfiles.store.os.fsync", full_disk)
    with pytest.raises(OSError) as info:
        store.write(store.relpath(ns, meta.key, hashlib.sha256(data).hexdigest()), data)
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert list(store.iter_temp_files()) == []
    assert list(store.iter_relpaths()) == []
    open_index(tmp_path).close()
    assert_cache_invariants(tmp_path)


def test_remove_temp_files_spares_young_ones(tmp_path: Path) -> None:
    ns = make_namespace()
    store = FileBlockStore(tmp_path)
    meta = make_chain(ns, 1)[0][0]
    folder = store.path(store.relpath(ns, meta.key, "0" * 64)).parent
    folder.mkdir(parents=True)
    old, young = folder / f".{meta.key}.0000.tmp", folder / f".{meta.key}.1111.tmp"
    old.write_bytes(b"x")
    young.write_bytes(b"y")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert {rel.rsplit("/", 1)[1] for rel, _ in store.iter_temp_files()} == {old.name, young.name}
    assert list(store.iter_relpaths()) == []  # temp files are not blocks
    assert store.remove_temp_files(older_than=60) == 1
    assert young.exists() and not old.exists()
    assert store.remove_temp_files() == 1
    open_index(tmp_path).close()
    assert_cache_invariants(tmp_path)


# --- lock ----------------------------------------------------------------------------


def test_second_lock_fails_at_once_naming_the_pid(tmp_path: Path) -> None:
    assert not is_locked(tmp_path)
    with CacheDirLock(tmp_path) as lock:
        assert lock.held and is_locked(tmp_path)
        assert lock_holder(tmp_path) == os.getpid()
        started = time.monotonic()
        with pytest.raises(CacheDirLocked) as info:
            CacheDirLock(tmp_path).acquire()
        assert time.monotonic() - started < 1.0
        assert info.value.pid == os.getpid()
        assert str(os.getpid()) in str(info.value) and str(tmp_path) in str(info.value)
    assert not is_locked(tmp_path)
    CacheDirLock(tmp_path).acquire()  # free again (released by the with block)


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    code = (
        "import sys, time; from omlx.adapters.blockfiles.lock import CacheDirLock; "
        f"l = CacheDirLock({str(tmp_path)!r}); l.acquire(); print('ok', flush=True); time.sleep(30)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ok"
        with pytest.raises(CacheDirLocked) as info:
            CacheDirLock(tmp_path).acquire()
        assert info.value.pid == proc.pid
    finally:
        proc.kill()
        proc.wait()
    CacheDirLock(tmp_path).acquire()  # the kernel dropped the dead process's lock


def _row(meta: BlockMeta, relpath: str, data: bytes) -> StoredBlock:
    checksum = hashlib.sha256(data).hexdigest()
    return StoredBlock(
        meta.key,
        meta.namespace,
        meta.parent_key,
        meta.token_count,
        len(data),
        checksum,
        relpath,
        1.0,
        1.0,
    )


def test_shared_locks_coexist_and_exclude_an_owner(tmp_path: Path) -> None:
    a, b = CacheDirLock(tmp_path, shared=True), CacheDirLock(tmp_path, shared=True)
    a.acquire()
    b.acquire()  # two servers on one shared index
    assert a.held and b.held and is_locked(tmp_path)
    with pytest.raises(CacheDirLocked):
        CacheDirLock(tmp_path).acquire()  # an embedded-index server would reconcile their files
    a.release()
    b.release()
    with CacheDirLock(tmp_path), pytest.raises(CacheDirLocked):
        CacheDirLock(tmp_path, shared=True).acquire()
