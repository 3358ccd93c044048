"""Export archives refused by name: another model, another version, a bad chain, a flipped byte,
a malformed manifest, too many blocks."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace

import pytest

from omlx.adapters.blockfiles.format import pack_block, unpack_block
from omlx.app.cache_controls import transfer
from omlx.app.cache_controls.transfer import (
    Archive,
    ImportRefused,
    ImportTooLarge,
    export_archive,
)
from omlx.domain.cache.blocks import BlockMeta, DecodedBlock, StoredBlock
from omlx.domain.cache.keys import block_key
from tests.unit.test_prefix_cache import namespace

NS = namespace(4)


class Files:
    """A cold source holding some block files (``files`` as the real cold tier answers)."""

    def __init__(self, blocks: list[tuple[StoredBlock, bytes]]) -> None:
        self.blocks = {row.key: (row, data) for row, data in blocks}
        self.queued: set[str] = set()  # keys the writer has not finished yet

    def writing(self, key):
        return key in self.queued

    def file_rows(self, keys):
        out = []
        for key in keys:
            if key not in self.blocks:
                break
            out.append(self.blocks[key][0])
        return out

    def read_files(self, rows):
        for row in rows:
            yield row, self.blocks[row.key][1]

    def verify(self, data, meta):
        """The cold tier's check of a block file (here: the real format, unpacked)."""
        tokens, _, metadata = unpack_block(data)
        if (
            metadata.get("namespace") != meta.namespace
            or block_key(meta.parent_key, tokens) != meta.key
        ):
            return None, "its tokens do not rehash to its key"
        return DecodedBlock(tokens, None, metadata), ""


class Cache:
    def __init__(self, ns=NS, cold=None, hot=()) -> None:
        self.namespace, self.cold = ns, cold if cold is not None else Files([])
        self.hot = set(hot)  # keys in RAM

    def root_of(self, tenant):
        return None


def block_files(tokens: list[int]) -> list[tuple[StoredBlock, bytes]]:
    out, parent = [], NS.digest
    for start in range(0, len(tokens), 4):
        part = tokens[start : start + 4]
        key = block_key(parent, part)
        meta = BlockMeta(key, parent, NS.digest, len(part))
        data = bytes(pack_block(meta, part, [], layer_count=0))
        out.append((StoredBlock(key, NS.digest, parent, len(part), len(data), "", "", 0, 0), data))
        parent = key
    return out


def archive_of(tokens: list[int]) -> bytes:
    made = export_archive(Cache(cold=Files(block_files(tokens))), tokens, None)
    assert made.tokens == len(tokens)
    return b"".join(made.chunks)


def read_archive(archive: bytes, cache: Cache, tenant: str | None, max_blocks: int = 1000):
    """``transfer.read_archive`` of archive bytes (the server reads a spooled file)."""
    with Archive(io.BytesIO(archive)) as opened:
        return transfer.read_archive(opened, cache, tenant, max_blocks)


def rewritten(archive: bytes, change) -> bytes:
    """The archive with its manifest passed through ``change``."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(archive)) as source,
        tarfile.open(fileobj=out, mode="w") as tar,
    ):
        for member in source.getmembers():
            data = source.extractfile(member).read()
            if member.name == "manifest.json":
                changed = change(json.loads(data))
                data = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_good_archive_is_read_whole_in_chain_order() -> None:
    blocks = read_archive(archive_of(list(range(10))), Cache(), None)
    assert [b.tokens for b in blocks] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]


def test_another_model_is_refused_by_name() -> None:
    other = replace(NS, digest=block_key(NS.digest, [1]), model_name="other-model")
    with pytest.raises(ImportRefused, match=r"archive is for model 'fake'.*'other-model'"):
        read_archive(archive_of(list(range(8))), Cache(other), None)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda m: {**m, "cache_format_version": 1}, "cache format version 1"),
        (lambda m: {**m, "version": 9}, "v9"),
        (lambda m: {**m, "blocks": m["blocks"][1:]}, "not the next block"),
        (lambda m: {**m, "blocks": [{**m["blocks"][0], "sha256": "0" * 64}]}, "checksum"),
    ],
)
def test_a_wrong_version_chain_or_checksum_is_refused(change, words) -> None:
    with pytest.raises(ImportRefused, match=words):
        read_archive(rewritten(archive_of(list(range(8))), change), Cache(), None)


def test_an_archive_that_is_no_archive_is_refused() -> None:
    with pytest.raises(ImportRefused, match="not an omlx cache archive"):
        read_archive(b"hello", Cache(), None)


def test_an_export_is_a_tar_that_tarfile_reads_with_its_manifest_last() -> None:
    archive = archive_of(list(range(10)))
    assert len(archive) % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert names[-1] == "manifest.json" and len(names) == 4
    assert [f"blocks/{b['key']}.safetensors" for b in manifest["blocks"]] == names[:-1]


def with_deep(manifest: dict, field: str, levels: int) -> bytes:
    """``manifest`` with ``field`` an array nested ``levels`` deep (no encoder recurses so far)."""
    text = json.dumps({**manifest, field: "DEEP"})
    return text.replace('"DEEP"', "[" * levels + "]" * levels).encode()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            lambda m: {k: v for k, v in m.items() if k != "namespace"},
            "missing required field `namespace`",
        ),
        (
            lambda m: {**m, "blocks": [{k: v for k, v in m["blocks"][0].items() if k != "sha256"}]},
            "`sha256` - at `manifest.blocks\\[0\\]`",
        ),
        (
            lambda m: {**m, "blocks": [{**m["blocks"][0], "key": 7}]},
            "Expected `str`, got `int` - at `manifest.blocks\\[0\\].key`",
        ),
        (lambda m: {**m, "blocks": "all"}, "Expected `array`, got `str` - at `manifest.blocks`"),
        (lambda m: {**m, "version": "1"}, "Expected `int`, got `str` - at `manifest.version`"),
        (lambda m: with_deep(m, "blocks", 5000), "manifest.blocks"),
        (lambda m: with_deep(m, "extra", 100_000), "not JSON the server reads"),
        (lambda m: [m], "Expected `object`, got `array`"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_field(change, words) -> None:
    with pytest.raises(ImportRefused, match=words):
        read_archive(rewritten(archive_of(list(range(8))), change), Cache(), None)


def test_a_manifest_that_is_not_json_is_refused() -> None:
    archive = archive_of(list(range(8))).replace(b'"format"', b"'format'")
    with pytest.raises(ImportRefused, match="not JSON"):
        read_archive(archive, Cache(), None)


def test_an_archive_with_more_blocks_than_allowed_is_refused_before_any_is_read() -> None:
    archive = archive_of(list(range(12)))  # three blocks
    with pytest.raises(ImportTooLarge, match=r"3 blocks.*at most 2 .*max_import_blocks"):
        read_archive(archive, Cache(), None, max_blocks=2)
    assert len(read_archive(archive, Cache(), None, max_blocks=3)) == 3


def test_an_export_right_after_a_turn_waits_for_its_blocks_on_their_way_to_disk(monkeypatch):
    """A turn's blocks land on disk moments after its answer: the export waits for those in
    RAM or queued, and carries them all; a block neither queued nor in RAM is not waited for."""
    import threading

    tokens = list(range(12))
    blocks = block_files(tokens)
    files = Files(blocks[:1])
    files.queued.add(blocks[1][0].key)
    cache = Cache(cold=files, hot=[blocks[2][0].key])

    def writer():  # the writer thread lands the two blocks a little later
        files.blocks[blocks[1][0].key] = blocks[1]
        files.queued.discard(blocks[1][0].key)
        files.blocks[blocks[2][0].key] = blocks[2]

    timer = threading.Timer(0.3, writer)
    timer.start()
    try:
        assert export_archive(cache, tokens, None).tokens == 12
    finally:
        timer.join()

    lone = Files(blocks[:1])  # the rest neither queued nor in RAM: exported at once, no wait
    monkeypatch.setattr(transfer, "EXPORT_SETTLE_S", 60.0)
    assert export_archive(Cache(cold=lone), tokens, None).tokens == 4
