"""Namespace digests and chained block keys (DESIGN §4): the cache's identity contract.

Keys must be identical across processes and versions, so they are SHA-256 over
canonical bytes, never Python's ``hash``.

*Partial blocks.* Besides full blocks, the trailing partial block of a finished request
(its last ``n < block_size`` tokens) is keyed and stored too, with the same formula:
``block_key(parent, partial_tokens)``. This departs from DESIGN §4 ("only full blocks are
keyed"): without it a follow-up turn, or a replay after a restart, recomputes up to
``block_size - 1`` tokens of the previous turn. A partial key never extends a chain (no
block names it as parent) and is only used by token-granular matching: KV at position
``j`` depends only on tokens ``<= j``, so any stored child of the last matched key whose
first ``k`` tokens equal the prompt's next ``k`` serves those ``k`` positions.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

CACHE_FORMAT_VERSION = 2  # 2: cache layouts (state and window objects), grouped KV layers

# Kinds of stored objects. ``kv``: a block's KV of the full-attention layers, named by its
# block key. ``window`` and ``state`` belong to a *restore point* (a position, named by the
# chain key of the tokens up to it, its *anchor*): ``window`` holds a block's KV of the
# sliding-window layers, ``state`` the recurrent layers' state after the anchor's last token.
# ``external``: a block saved through the library API (``omlx.cache``) under a hash its
# caller chose; it carries no tokens, so nothing rehashes to its key and the checksum the
# index records is its integrity check (``external_key`` says how its key is made).
# ``image``: a vision-language model's image rows (its encoder's output for one image),
# named by ``image_rows_key``: the namespace, the tenant and the image's digest.
KV, WINDOW, STATE, EXTERNAL, IMAGE = "kv", "window", "state", "external", "image"
KINDS = (KV, WINDOW, STATE, EXTERNAL, IMAGE)
EXTERNAL_HASH_MAX = 32  # bytes of a caller's block hash: its hex must fit the parent_key column


def namespace_digest(identity: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of what makes KV reusable.

    ``identity`` holds the model config, the weights digest, the tokenizer files'
    digest, the KV dtype, the block size; the cache format version is added here.
    """
    canonical = dict(identity)
    canonical["cache_format_version"] = CACHE_FORMAT_VERSION
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tenant_root(namespace: str, tenant: str) -> str:
    """The chain root of ``tenant``'s blocks in ``namespace`` (``key_{-1}``, salted per tenant).

    Another tenant's prompt hashes to other keys on every tier, so it is never a hit (nor
    a timing signal) for this one. The default tenant's root is the namespace itself.
    """
    h = hashlib.sha256(bytes.fromhex(namespace))
    h.update(b"\0tenant\0" + tenant.encode("utf-8"))
    return h.hexdigest()


def block_key(parent: str, tokens: Sequence[int]) -> str:
    """``SHA-256(parent || token ids as uint32 LE)``, hex; ``parent`` is a hex digest."""
    h = hashlib.sha256(bytes.fromhex(parent))
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return h.hexdigest()


def object_key(kind: str, anchor: str) -> str:
    """The key of the ``kind`` object of ``anchor``: the anchor itself for KV blocks."""
    if kind == KV:
        return anchor
    if kind not in KINDS:
        raise ValueError(f"unknown object kind {kind!r}")
    return hashlib.sha256(kind.encode() + b"\0" + bytes.fromhex(anchor)).hexdigest()


def external_key(namespace: str, block_hash: bytes) -> str:
    """The index key of the block a caller names ``block_hash`` in ``namespace``.

    The caller's hash is scoped by the namespace (two models may use one hash) and kept,
    as hex, in the row's ``parent_key``: the key re-derives from the row alone.
    """
    if not 0 < len(block_hash) <= EXTERNAL_HASH_MAX:
        raise ValueError(
            f"a block hash must be 1 to {EXTERNAL_HASH_MAX} bytes, got {len(block_hash)}"
        )
    anchor = hashlib.sha256(bytes.fromhex(namespace) + bytes(block_hash)).hexdigest()
    return object_key(EXTERNAL, anchor)


def image_anchor(root: str, digest: str) -> str:
    """What an image's rows object hangs from: ``root`` (a tenant's chain root) and the
    image's digest. Hashed with a prefix of its own, so no chain key is ever one."""
    h = hashlib.sha256(b"omlx-image-rows\0" + bytes.fromhex(root))
    h.update(bytes.fromhex(digest))
    return h.hexdigest()


def image_rows_key(root: str, digest: str) -> tuple[str, str]:
    """The key of the image rows of ``digest`` under ``root``, and its anchor (its row's
    ``parent_key``): another tenant's root names other rows, on every tier."""
    anchor = image_anchor(root, digest)
    return object_key(IMAGE, anchor), anchor


def rederives(kind: str, key: str, parent_key: str, tokens: Sequence[int], namespace: str) -> bool:
    """Whether a stored object's ``key`` follows from what names it: the integrity check by kind.

    A KV block or restore-point object: its tokens rehash, from ``parent_key``, to the key.
    An external block has no tokens: its key must follow from its namespace and its
    caller's hash (``parent_key``); its bytes are checked by their checksum alone. An
    image rows object has none either: its key must follow from its anchor.
    """
    if kind == EXTERNAL:
        try:
            return not tokens and external_key(namespace, bytes.fromhex(parent_key)) == key
        except ValueError:  # a parent_key that is no caller's hash
            return False
    if kind == IMAGE:  # its anchor (parent_key) is checked by who asks for it by digest
        try:
            return not tokens and object_key(IMAGE, parent_key) == key
        except ValueError:
            return False
    try:
        return object_key(kind, block_key(parent_key, tokens)) == key
    except struct.error:  # a token id no uint32 holds (negative, huge): no key is its
        return False


def chain_keys(namespace: str, tokens: Sequence[int], block_size: int) -> list[str]:
    """Keys of every full block of ``tokens``; a trailing partial block has none."""
    return list(iter_chain_keys(namespace, tokens, block_size))


def stored_keys(root: str, tokens: Sequence[int], block_size: int) -> list[str]:
    """The keys a request stores ``tokens`` under: every full block's, then the trailing
    partial block's (what a pin keeps and an export carries)."""
    keys = chain_keys(root, tokens, block_size)
    start = len(keys) * block_size
    if start < len(tokens):
        keys.append(block_key(keys[-1] if keys else root, tokens[start:]))
    return keys


def iter_chain_keys(parent: str, tokens: Sequence[int], block_size: int) -> Iterator[str]:
    """``chain_keys`` one key at a time, for a walk that may stop at its first miss.

    The same keys as ``block_key`` block by block, made faster for 1,000-block prompts
    (2.5 ms instead of 4 ms at 64k tokens here): the token ids are packed once, and each
    digest is chained as raw bytes, turned into hex only as it is handed out.
    """
    full = len(tokens) - len(tokens) % block_size
    if full == 0:
        return
    packed = array("I", tokens[:full] if len(tokens) != full else tokens)
    if packed.itemsize != 4:  # no 32-bit "I" on this platform: the portable path
        for start in range(0, full, block_size):
            parent = block_key(parent, tokens[start : start + block_size])
            yield parent
        return
    if sys.byteorder == "big":
        packed.byteswap()
    data = memoryview(packed.tobytes())
    step = block_size * 4
    sha256 = hashlib.sha256
    digest = bytes.fromhex(parent)
    for start in range(0, full * 4, step):
        h = sha256(digest)
        h.update(data[start : start + step])
        digest = h.digest()
        yield digest.hex()
