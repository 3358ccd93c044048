"""Priming: the latest conversation joined into a kept cache before its next turn comes.

On a running server a conversation's next turn continues the finished request's kept
cache (``KeptCaches``); after a restart that cache is gone, and the first turn would
assemble its whole prefix from the hot tier's blocks, copying it into fresh arrays.
Once warm restart's prefetch has read the blocks back, the engine runs ``prime`` while
it is idle: the same assembly a restore does, kept as the finished request kept it (its
tokens, full blocks and the partial one at its end, and a cache holding exactly them).
"""

from __future__ import annotations

from collections.abc import Sequence

from omlx.domain.cache.hot_set import HotSetEntry
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import KV
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.ports import KeptCaches, KVCodec

PRIMED = "primed"


def latest_conversation(entries: Sequence[HotSetEntry]) -> tuple[HotSetEntry, ...]:
    """The hot set's first chain (``hot_set_order``: the conversation used last, root
    first): its KV blocks while each extends the one before."""
    out: list[HotSetEntry] = []
    for entry in entries:
        if entry.kind != KV or (out and entry.parent_key != out[-1].key):
            break
        out.append(entry)
    return tuple(out)


def prime(
    keys: Sequence[str],
    *,
    hot: HotTier,
    codec: KVCodec,
    kept: KeptCaches | None,
    layout: CacheLayout,
    block_size: int,
) -> str:
    """Join the chain ``keys`` (root first) from RAM into a kept cache (engine thread).

    ``PRIMED``, or why not: nothing is kept when a request finished first (its cache is
    the newer), for a layout kept caches cannot hold (state, windows), or when the cache
    would not be kept (``KeptCaches.fits``). The chain is cut at its first block not in
    RAM and after a partial block (a finished request's cache ends there).
    """
    if kept is None or not layout.plain:
        return "no kept caches for this layout"
    if kept.nbytes:
        return "a request came first"
    blocks = []
    for key in keys:
        block = hot.peek(key)
        if block is None or block.meta.kind != KV:
            break
        blocks.append(block)
        if block.meta.token_count < block_size:
            break
    if not blocks:
        return "its blocks are not in RAM"
    nbytes = sum(b.nbytes for b in blocks)
    if not kept.fits(nbytes):
        return f"{nbytes} bytes would not be kept"
    tokens = [t for b in blocks for t in b.tokens]
    # Room past its end, as a restore leaves: the next turn's first tokens go in place.
    kept.keep(tokens, codec.assemble([b.payload for b in blocks], room=block_size))
    return PRIMED if kept.nbytes else "the kept caches declined it"
