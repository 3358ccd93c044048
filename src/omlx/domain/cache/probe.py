"""How much of a prompt the cache holds now, found without touching it (diagnostics, explain).

Unlike ``PrefixMatcher.lookup`` nothing is pinned, promoted, read from disk or marked
recently used: whole blocks are asked of RAM and then of the cold tier's index (one
query, whose rows the request's lookup then reuses), and where they stop the RAM blocks hanging from the last match lend the tokens
they share with the prompt, as do disk blocks the prompt covers whole (known by their
key). So a ``/v1/cache/explain`` or a response header never changes what it describes.
A disk block the prompt leaves part-way is not read: where the index lists its tokens
the probe counts exactly, else it may report up to ``block_size - 1`` tokens fewer than a
request restores. A request's own report is taken from its restore, not from here
(``CacheSession.restored``): this answers ``/v1/cache/explain``, and hands the request's
lookup the keys and rows it found.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from omlx.domain.cache.blocks import HOT, NONE, SSD, CachedPrefix, PromptChain
from omlx.domain.cache.hot_tier import HotBlock, HotTier
from omlx.domain.cache.keys import chain_keys
from omlx.domain.cache.partial_match import common_prefix, held_past, upper_bound
from omlx.domain.cache.ports import ColdSource

__all__ = ["HOT", "NONE", "SSD", "CachedPrefix", "probe"]


def _stored_after(hot: HotTier, block: HotBlock, start: int, want: int = 32) -> tuple[int, ...]:
    """Up to ``want`` tokens the cache holds from ``block``'s position ``start`` on, down its chain."""
    tokens = list(block.tokens[start:])
    while len(tokens) < want:
        children = hot.children(block.key)
        if not children:
            break
        block = children[0]
        tokens.extend(block.tokens)
    return tuple(tokens[:want])


def probe(
    tokens: Sequence[int],
    *,
    namespace: str,
    block_size: int,
    hot: HotTier,
    cold: ColdSource | None,
    clock: Callable[[], float] = time.time,
) -> CachedPrefix:
    """What of ``tokens`` the tiers hold now (see the module docstring); never raises on a miss.

    ``namespace``: the chain's root (a tenant's, or the namespace's digest). The keys it
    hashed and the index's rows travel in the answer's ``chain`` for the lookup to reuse.
    The answer names the server that computed the deepest block it counts (RAM blocks
    remember it; disk blocks' rows record it).
    """
    limit = max(len(tokens) - 1, 0)
    keys = chain_keys(namespace, tokens[: (limit // block_size) * block_size], block_size)
    n_hot = 0
    while n_hot < len(keys) and keys[n_hot] in hot:
        n_hot += 1
    n_ssd = 0
    rows = None
    if n_hot < len(keys) and cold is not None:
        rest = keys[n_hot:]
        rows = cold.rows(rest)
        while n_ssd < len(rest) and rows is not None and rest[n_ssd] in rows:
            n_ssd += 1
    matched = (n_hot + n_ssd) * block_size
    parent = keys[n_hot + n_ssd - 1] if n_hot + n_ssd else namespace
    want = tuple(tokens[matched:limit])
    # The disk children listed as the lookup will want them (the next block's worth).
    kids = tuple(cold.children(parent, want[:block_size])) if cold is not None and want else ()
    chain = PromptChain(namespace, tuple(keys), rows, n_hot, clock(), parent, kids)
    shared, stored_next = 0, ()
    best = None
    for child in hot.children(parent):
        n = common_prefix(child.tokens, want)
        if best is None or n > shared:
            best, shared = child, n
    if best is not None:
        stored_next = _stored_after(hot, best, shared)
    disk_shared, disk_child = 0, None
    if cold is not None and shared < len(want):
        # Known without a read: a disk child whose tokens the index listed, or one the
        # prompt covers whole (checked by its key, ``upper_bound``).
        for meta in kids:
            bound = upper_bound(meta, want)
            exact = bool(meta.tokens) or (
                meta.token_count <= len(want) and bound == meta.token_count
            )
            if exact and bound > max(shared, disk_shared):
                disk_shared, disk_child = bound, meta
    if disk_child is not None:
        held = matched + disk_shared
        return CachedPrefix(
            tokens=held,
            prompt_tokens=len(tokens),
            hot_tokens=n_hot * block_size,
            ssd_tokens=n_ssd * block_size + disk_shared,
            stored_next=tuple(disk_child.tokens[disk_shared : disk_shared + 32]),
            chain=chain,
            computed_by=disk_child.computed_by,
            matched=held,
        )
    deepest = ""
    if best is not None and shared:
        deepest = best.meta.computed_by
    elif n_ssd:
        deepest = (rows or {})[keys[n_hot + n_ssd - 1]].computed_by or ""
    elif n_hot:
        held = hot.peek(keys[n_hot - 1])  # None: evicted since it was counted
        deepest = held.meta.computed_by if held is not None else ""
    if not stored_next and best is None:
        stored_next = held_past(None, parent, hot.children, kids)  # a listed disk child
    return CachedPrefix(
        tokens=matched + shared,
        prompt_tokens=len(tokens),
        hot_tokens=n_hot * block_size + shared,
        ssd_tokens=n_ssd * block_size,
        stored_next=tuple(stored_next),
        chain=chain,
        computed_by=deepest,
        matched=matched + shared,
    )
