"""Export a conversation's cached prefix to one archive, and import it, verified, elsewhere.

An archive is a tar of ``manifest.json`` (archive version, cache format version, the
namespace digest and model, block size, and per block its key, parent key, token count,
kind and SHA-256) and ``blocks/<key>.safetensors``, the block files as the cold tier
holds them. Import checks all of it before anything is queued for the index: the
namespace (a wrong model or quantization is refused by name), both versions, every
file's checksum, that each file's tokens rehash to its key from its parent, and that the
blocks chain from the importing tenant's root. Imported blocks take the ordinary write
path (file first, row second).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION, KV, stored_keys
from omlx.domain.cache.prefix_cache import PrefixCache

ARCHIVE_FORMAT = "omlx-cache-export"
ARCHIVE_VERSION = 1
MANIFEST = "manifest.json"


class ImportRefused(ValueError):
    """An archive that cannot be imported here; the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class ImportedBlock:
    meta: BlockMeta
    tokens: tuple[int, ...]
    data: bytes


def export_archive(
    prefix_cache: PrefixCache, tokens: Sequence[int], tenant: str | None
) -> tuple[bytes, int]:
    """The archive of what the cold tier holds of ``tokens``' prefix; and its token count."""
    cold = prefix_cache.cold
    if cold is None:
        raise ImportRefused("this model has no disk tier to export from")
    namespace = prefix_cache.namespace
    root = prefix_cache.root_of(tenant) or namespace.digest
    files = cold.files(stored_keys(root, tokens, namespace.block_size))
    if not files:
        raise ImportRefused(
            "nothing of this prompt is on disk yet (a block is written once it completes)"
        )
    manifest = {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "cache_format_version": CACHE_FORMAT_VERSION,
        "namespace": namespace.digest,
        "model": namespace.model_name,
        "block_size": namespace.block_size,
        "blocks": [
            {
                "key": row.key,
                "parent_key": row.parent_key,
                "token_count": row.token_count,
                "kind": row.kind,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            for row, data in files
        ],
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        _add(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
        for row, data in files:
            _add(tar, f"blocks/{row.key}.safetensors", data)
    return out.getvalue(), sum(row.token_count for row, _ in files)


def read_archive(
    archive: bytes, prefix_cache: PrefixCache, tenant: str | None
) -> list[ImportedBlock]:
    """Every block of ``archive``, verified for this model and tenant (``ImportRefused``)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            manifest = json.loads(_read(tar, members, MANIFEST))
            blocks = manifest["blocks"]
            files = {
                b["key"]: _read(tar, members, f"blocks/{b['key']}.safetensors") for b in blocks
            }
    except (tarfile.TarError, KeyError, TypeError, ValueError) as exc:
        raise ImportRefused(f"not an omlx cache archive: {exc}") from exc
    namespace = prefix_cache.namespace
    if manifest.get("format") != ARCHIVE_FORMAT or manifest.get("version") != ARCHIVE_VERSION:
        raise ImportRefused(
            f"archive format {manifest.get('format')!r} v{manifest.get('version')}: this server reads {ARCHIVE_FORMAT} v{ARCHIVE_VERSION}"
        )
    if manifest.get("cache_format_version") != CACHE_FORMAT_VERSION:
        raise ImportRefused(
            f"cache format version {manifest.get('cache_format_version')}: this server's is {CACHE_FORMAT_VERSION}"
        )
    if manifest.get("namespace") != namespace.digest:
        raise ImportRefused(
            f"the archive is for model {manifest.get('model')!r} (namespace {str(manifest.get('namespace'))[:12]}); "
            f"this server's {namespace.model_name!r} is namespace {namespace.digest[:12]}: another model, "
            "quantization or block size"
        )
    cold = prefix_cache.cold
    if cold is None:
        raise ImportRefused("this model has no disk tier to import into")
    parent = prefix_cache.root_of(tenant) or namespace.digest
    verified: list[ImportedBlock] = []
    for entry in blocks:
        key, data = entry["key"], files[entry["key"]]
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ImportRefused(f"block {key}: its bytes do not match the manifest's checksum")
        if entry.get("kind", KV) != KV or entry["parent_key"] != parent:
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
        verified.append(ImportedBlock(meta, tokens, data))
        if len(tokens) == namespace.block_size:
            parent = key  # a partial block ends the chain
    return verified


def import_blocks(prefix_cache: PrefixCache, blocks: Sequence[ImportedBlock]) -> tuple[int, int]:
    """Queue the verified blocks the disk tier lacks for writing; (queued, already there)."""
    cold = prefix_cache.cold
    if cold is None:
        raise ImportRefused("this model has no disk tier to import into")
    present = cold.present([b.meta.key for b in blocks])
    queued = 0
    for block in blocks:
        if block.meta.key not in present:
            cold.put(block.meta, block.tokens, block.data)
            queued += 1
    return queued, len(blocks) - queued


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _read(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], name: str) -> bytes:
    member = members.get(name)
    if member is None:
        raise KeyError(f"{name} is missing")
    handle = tar.extractfile(member)
    if handle is None:
        raise KeyError(f"{name} is not a file")
    return handle.read()
