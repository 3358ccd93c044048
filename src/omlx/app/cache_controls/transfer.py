"""Export a conversation's cached prefix to one archive, and import it, verified, elsewhere.

An archive is a tar of ``blocks/<key>.safetensors`` (the block files as the cold tier
holds them) and ``manifest.json`` (archive version, cache format version, the namespace
digest and model, block size, and per block its key, parent key, token count, kind and
SHA-256). An export is streamed file by file, its manifest last, listing exactly the
files sent; an import reads the archive from a file (the server spools the request body
to one), so neither holds the archive in memory. Import checks all of it before
anything is written: the manifest's shape and size, the namespace (a wrong model or
quantization is refused by name), both versions, every file's checksum, that each
file's tokens rehash to its key from its parent, and that the blocks chain from the
importing tenant's root. Imported blocks take the ordinary write path (file first, row
second), waiting for room in the writer's queue, and each write's outcome is counted.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO

import msgspec

from omlx.app.cache_controls.tar_stream import TarStream
from omlx.domain.cache.blocks import BlockMeta, StoredBlock
from omlx.domain.cache.cold_writes import WriteOutcome
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION, KV, stored_keys
from omlx.domain.cache.prefix_cache import PrefixCache

ARCHIVE_FORMAT = "omlx-cache-export"
ARCHIVE_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_BYTES_PER_BLOCK = 1024  # a manifest entry is about 300 bytes of JSON
MAX_BLOCK_FILE_BYTES = 1 << 30  # one block of a 70B model's KV is under 100 MB


class ImportRefused(ValueError):
    """An archive that cannot be imported here; the message names what is wrong."""


class ImportTooLarge(ImportRefused):
    """An archive with more blocks than ``max_import_blocks`` allows."""


class _ManifestBlock(msgspec.Struct, forbid_unknown_fields=False):
    key: str
    parent_key: str
    token_count: int
    sha256: str
    kind: str = KV


class _Manifest(msgspec.Struct, forbid_unknown_fields=False):
    format: str
    version: int
    cache_format_version: int
    namespace: str
    blocks: list[_ManifestBlock]
    model: str = ""
    block_size: int = 0


EXPORT_SETTLE_S = 10.0  # the longest an export waits for a just-finished turn's blocks


@dataclass(frozen=True, slots=True)
class ImportedBlock:
    meta: BlockMeta
    tokens: tuple[int, ...]
    nbytes: int  # of its file, read again from the archive when written


@dataclass(frozen=True, slots=True)
class ExportStream:
    """An export's archive as chunks to send, and the prompt tokens its blocks cover."""

    tokens: int
    chunks: Iterator[bytes]


@dataclass(frozen=True, slots=True)
class ImportCounts:
    """How an import's blocks ended: written now, already on disk, or refused (per reason)."""

    written: int
    present: int
    refused: dict[str, int]


def export_archive(
    prefix_cache: PrefixCache, tokens: Sequence[int], tenant: str | None
) -> ExportStream:
    """The archive of what the cold tier holds of ``tokens``' prefix, as chunks read file by
    file while they are sent; and the token count of the blocks found."""
    cold = prefix_cache.cold
    if cold is None:
        raise ImportRefused("this model has no disk tier to export from")
    root = prefix_cache.root_of(tenant) or prefix_cache.namespace.digest
    keys = stored_keys(root, tokens, prefix_cache.namespace.block_size)
    rows = _settled_rows(prefix_cache, keys)
    if not rows:
        raise ImportRefused(
            "nothing of this prompt is on disk yet (a block is written once it completes)"
        )
    return ExportStream(sum(row.token_count for row in rows), _archive_chunks(prefix_cache, rows))


def _settled_rows(prefix_cache: PrefixCache, keys: Sequence[str]) -> list[StoredBlock]:
    """The disk rows of ``keys``' chain, once the blocks on their way to disk have landed.

    A turn's blocks reach RAM while it runs and disk moments after its answer (the writer
    thread's queue): an export sent right after the turn would otherwise find part of its
    prompt or none. Waits while the first block missing from disk is in RAM or queued
    (it will be written), up to ``EXPORT_SETTLE_S``; then exports what disk holds.
    """
    cold = prefix_cache.cold
    assert cold is not None
    deadline = time.monotonic() + EXPORT_SETTLE_S
    while True:
        rows = cold.file_rows(keys)
        if len(rows) == len(keys) or time.monotonic() >= deadline:
            return rows
        missing = keys[len(rows)]
        if not (cold.writing(missing) or missing in prefix_cache.hot):
            return rows
        time.sleep(0.05)


def _archive_chunks(prefix_cache: PrefixCache, rows: Sequence[StoredBlock]) -> Iterator[bytes]:
    """Each block file as a tar member, then the manifest of the files actually sent (a file
    gone since the rows were read ends the chain there)."""
    assert prefix_cache.cold is not None
    namespace = prefix_cache.namespace
    tar, entries = TarStream(), []
    for row, data in prefix_cache.cold.read_files(rows):
        entries.append(
            {
                "key": row.key,
                "parent_key": row.parent_key,
                "token_count": row.token_count,
                "kind": row.kind,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        yield tar.member(f"blocks/{row.key}.safetensors", data)
    manifest = {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "cache_format_version": CACHE_FORMAT_VERSION,
        "namespace": namespace.digest,
        "model": namespace.model_name,
        "block_size": namespace.block_size,
        "blocks": entries,
    }
    yield tar.member(MANIFEST, json.dumps(manifest, indent=1).encode())
    yield tar.end()


class Archive:
    """An archive's members, read one at a time from a seekable file (a context manager)."""

    def __init__(self, fileobj: IO[bytes]) -> None:
        try:
            self._tar = tarfile.open(fileobj=fileobj, mode="r:")  # noqa: SIM115  (__exit__ closes it)
            self._members = {m.name: m for m in self._tar.getmembers() if m.isfile()}
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise ImportRefused(f"not an omlx cache archive (a tar): {exc}") from exc

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tar.close()

    def read(self, name: str, limit: int) -> bytes:
        """Member ``name``'s bytes (``ImportRefused`` when missing or over ``limit``)."""
        member = self._members.get(name)
        if member is None:
            raise ImportRefused(f"not an omlx cache archive: {name} is missing")
        if member.size > limit:
            raise ImportRefused(f"{name} is {member.size} bytes, more than {limit} allowed")
        handle = self._tar.extractfile(member)
        if handle is None:
            raise ImportRefused(f"not an omlx cache archive: {name} is not a file")
        try:
            return handle.read()
        except (tarfile.TarError, OSError) as exc:
            raise ImportRefused(f"{name} cannot be read: {exc}") from exc

    def block(self, key: str) -> bytes:
        """Block ``key``'s file bytes."""
        return self.read(f"blocks/{key}.safetensors", MAX_BLOCK_FILE_BYTES)

    def manifest(self, max_blocks: int) -> _Manifest:
        """The manifest, its shape checked first (a malformed one names the
        field at fault) and its block count bounded (``ImportTooLarge``)."""
        raw = self.read(MANIFEST, MANIFEST_BYTES_PER_BLOCK * max_blocks + 65536)
        try:
            manifest = msgspec.json.decode(raw, type=_Manifest, strict=True)
        except msgspec.ValidationError as exc:
            where = str(exc).replace("`$", "`manifest")
            raise ImportRefused(f"{MANIFEST} is malformed: {where}") from exc
        except (msgspec.DecodeError, RecursionError) as exc:
            raise ImportRefused(f"{MANIFEST} is not JSON the server reads: {exc}") from exc
        if len(manifest.blocks) > max_blocks:
            raise ImportTooLarge(
                f"the archive has {len(manifest.blocks)} blocks; this server imports at most "
                f"{max_blocks} at once (max_import_blocks)"
            )
        return manifest


def read_archive(
    archive: Archive, prefix_cache: PrefixCache, tenant: str | None, max_blocks: int
) -> list[ImportedBlock]:
    """Every block of ``archive``, verified for this model and tenant (``ImportRefused``)."""
    manifest = archive.manifest(max_blocks)
    namespace = prefix_cache.namespace
    if manifest.format != ARCHIVE_FORMAT or manifest.version != ARCHIVE_VERSION:
        raise ImportRefused(
            f"archive format {manifest.format!r} v{manifest.version}: this server reads {ARCHIVE_FORMAT} v{ARCHIVE_VERSION}"
        )
    if manifest.cache_format_version != CACHE_FORMAT_VERSION:
        raise ImportRefused(
            f"cache format version {manifest.cache_format_version}: this server's is {CACHE_FORMAT_VERSION}"
        )
    if manifest.namespace != namespace.digest:
        raise ImportRefused(
            f"the archive is for model {manifest.model!r} (namespace {manifest.namespace[:12]}); "
            f"this server's {namespace.model_name!r} is namespace {namespace.digest[:12]}: another model, "
            "quantization or block size"
        )
    cold = prefix_cache.cold
    if cold is None:
        raise ImportRefused("this model has no disk tier to import into")
    parent = prefix_cache.root_of(tenant) or namespace.digest
    verified: list[ImportedBlock] = []
    for entry in manifest.blocks:
        key, data = entry.key, archive.block(entry.key)
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ImportRefused(f"block {key}: its bytes do not match the manifest's checksum")
        if entry.kind != KV or entry.parent_key != parent:
            raise ImportRefused(
                f"block {key}: not the next block of this tenant's chain (exported by another "
                "tenant, or out of order)"
            )
        # The cold tier's own check of every block it reads: decoded, rehashed, named.
        decoded, problem = cold.verify(data, BlockMeta(key, parent, namespace.digest, 0))
        if decoded is None:
            raise ImportRefused(f"block {key}: {problem}")
        tokens = tuple(decoded.tokens)
        meta = BlockMeta(key, parent, namespace.digest, len(tokens))
        verified.append(ImportedBlock(meta, tokens, len(data)))
        if len(tokens) == namespace.block_size:
            parent = key  # a partial block ends the chain
    return verified


def import_blocks(
    prefix_cache: PrefixCache, archive: Archive, blocks: Sequence[ImportedBlock]
) -> ImportCounts:
    """Write the verified blocks the disk tier lacks, waiting for each write to end."""
    cold = prefix_cache.cold
    if cold is None:
        raise ImportRefused("this model has no disk tier to import into")
    present = cold.present([b.meta.key for b in blocks])
    missing = [b for b in blocks if b.meta.key not in present]

    def files() -> Iterator[tuple[BlockMeta, tuple[int, ...], bytes]]:
        for block in missing:  # read again, one at a time: the archive may be gigabytes
            data = archive.block(block.meta.key)
            yield block.meta, block.tokens, data

    outcomes = cold.write_all(files())
    outcomes.pop(WriteOutcome.WRITTEN.value, 0)
    existing = outcomes.pop(WriteOutcome.EXISTING.value, 0)  # written by someone meanwhile
    refused = {reason.removeprefix("dropped_"): n for reason, n in outcomes.items()}
    # Counted from the index, not the writes: an archive larger than the disk budget has
    # its first blocks evicted (LRU) to make room for its last ones.
    kept = len(cold.present([b.meta.key for b in missing]))
    evicted = len(missing) - existing - sum(refused.values()) - kept
    if evicted > 0:
        refused["evicted_for_room"] = evicted
    return ImportCounts(kept - existing, len(present) + existing, dict(sorted(refused.items())))
