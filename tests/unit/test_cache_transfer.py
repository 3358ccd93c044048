"""Export archives refused by name: another model, another version, a bad chain, a flipped byte."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import replace

import pytest

from omlx.adapters.blockfiles.format import pack_block, unpack_block
from omlx.app.cache_controls.transfer import ImportRefused, export_archive, read_archive
from omlx.domain.cache.blocks import BlockMeta, DecodedBlock, StoredBlock
from omlx.domain.cache.keys import block_key
from tests.unit.test_prefix_cache import namespace

NS = namespace(4)


class Files:
    """A cold source holding some block files (``files`` as the real cold tier answers)."""

    def __init__(self, blocks: list[tuple[StoredBlock, bytes]]) -> None:
        self.blocks = {row.key: (row, data) for row, data in blocks}

    def files(self, keys):
        out = []
        for key in keys:
            if key not in self.blocks:
                break
            out.append(self.blocks[key])
        return out

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
    def __init__(self, ns=NS, cold=None) -> None:
        self.namespace, self.cold = ns, cold if cold is not None else Files([])

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
    archive, covered = export_archive(Cache(cold=Files(block_files(tokens))), tokens, None)
    assert covered == len(tokens)
    return archive


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
                data = json.dumps(change(json.loads(data))).encode()
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
