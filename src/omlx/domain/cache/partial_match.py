"""Token-granular matching below a block: the best stored child of the last matched key.

KV at position ``j`` depends only on tokens ``<= j``, so a stored block whose parent is
the last matched key and whose first ``k`` tokens equal the prompt's next ``k`` holds
valid KV for those ``k`` positions, whether it is full or a request's trailing partial
block (see ``keys``). Pure functions over candidates; the prefix cache does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.hot_tier import HotBlock
from omlx.domain.cache.keys import block_key

# At most this many cold candidates are read per lookup: each read is a block file.
MAX_COLD_CANDIDATE_READS = 3


@dataclass(frozen=True, slots=True)
class PartialMatch:
    """A child block of which the first ``shared`` positions continue the prompt."""

    meta: BlockMeta
    tokens: tuple[int, ...]  # all of the block's tokens
    payload: Any  # the block's whole payload, not yet truncated
    shared: int
    from_hot: bool


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for j in range(n):
        if a[j] != b[j]:
            return j
    return n


def upper_bound(meta: BlockMeta, want: Sequence[int]) -> int:
    """The most tokens a child can share with ``want``, known without reading it.

    Exact where the index listed the child's tokens. Otherwise a child no longer than
    ``want`` is checked by its key: rehashing ``want``'s first ``token_count`` tokens
    either gives its key (all shared) or not (one fewer at most).
    """
    if meta.tokens:
        return common_prefix(meta.tokens, want)
    n = meta.token_count
    if n > len(want):
        return len(want)
    return n if block_key(meta.parent_key, want[:n]) == meta.key else n - 1


def best_child(
    want: Sequence[int],
    hot: Iterable[HotBlock],
    cold: Callable[[], Iterable[BlockMeta]] | None,
    read: Callable[[BlockMeta], tuple[tuple[int, ...], Any] | None],
    max_reads: int = MAX_COLD_CANDIDATE_READS,
) -> PartialMatch | None:
    """The candidate sharing the longest run with ``want`` (> 0 tokens), or None.

    ``want`` is the prompt after the matched blocks, already capped so one token is left
    to prefill. RAM candidates cost nothing; ``cold`` (listed lazily, only when RAM
    leaves room to do better) is ranked by ``upper_bound`` and read, verified, through
    ``read`` while a read could still beat the best so far.
    """
    best: PartialMatch | None = None
    seen: set[str] = set()
    for block in hot:
        seen.add(block.key)
        k = common_prefix(block.tokens, want)
        if k > (best.shared if best else 0):
            best = PartialMatch(block.meta, block.tokens, block.payload, k, True)
    if cold is None or (best is not None and best.shared == len(want)):
        return best
    ranked = sorted(
        ((upper_bound(m, want), m) for m in cold() if m.key not in seen),
        key=lambda pair: -pair[0],
    )
    for bound, meta in ranked[:max_reads]:
        if bound <= (best.shared if best else 0):
            break
        found = read(meta)
        if found is None:
            continue
        tokens, payload = found
        k = common_prefix(tokens, want)
        if k > (best.shared if best else 0):
            best = PartialMatch(meta, tokens, payload, k, False)
    return best


def held_past(
    match: PartialMatch | None,
    parent: str,
    hot_children: Callable[[str], Sequence[HotBlock]],
    listed: Iterable[BlockMeta] = (),
    want: int = 32,
) -> tuple[int, ...]:
    """What the cache holds where the prompt leaves it (up to ``want`` tokens).

    The matched child's tokens past those it shares; with no match, those of ``parent``'s
    first child in RAM, else of a disk child whose tokens the index ``listed``. RAM blocks
    hanging below go on. Empty: nothing stored goes on from there (the prompt continues
    past everything kept), or only disk children the index did not list (reading their
    files to say so is not worth it).
    """
    if match is not None:
        tokens, key = list(match.tokens[match.shared :]), match.meta.key
    else:
        first = next((b for b in hot_children(parent) if b.tokens), None)
        if first is None:
            meta = next((m for m in listed if m.tokens), None)
            return tuple(meta.tokens[:want]) if meta is not None else ()
        tokens, key = list(first.tokens), first.key
    while len(tokens) < want:
        below = hot_children(key)
        if not below:
            break
        tokens.extend(below[0].tokens)
        key = below[0].key
    return tuple(tokens[:want])
