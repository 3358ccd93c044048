"""Restore points: the positions a cached prefix can be restored to, and what each needs.

For a model with only full-attention layers every matched position is one: its KV
blocks suffice. A model with sliding-window layers also needs, at a point ``p``, the
``window`` objects of the blocks covering ``[p - W, p)``; one with recurrent layers, the
``state`` snapshot taken at ``p``. Snapshots are costly (one of a 35B-class hybrid weighs
as much as ~3,000 tokens of KV), so they are kept sparse: where a prompt ends, where a
generation ends, where a request left the cached prefix (the *branch point*, so the next
request on that branch hits), and a few interior points on a nested power-of-two lattice
(two prompts sharing a prefix pick the same interior points inside it). Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omlx.domain.cache.keys import STATE, WINDOW, block_key, object_key
from omlx.domain.cache.layout import CacheLayout

INTERIOR_POINTS = 4  # the most interior snapshots one request persists


@dataclass(frozen=True, slots=True)
class Need:
    """One object a restore point needs: ``kind`` of the anchor ``block_key(parent, tokens)``."""

    kind: str
    key: str  # object_key(kind, anchor)
    parent: str
    tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RestorePoint:
    position: int
    anchor: str  # the chain key of the tokens before ``position``
    parent: str  # the key the anchor's block hangs from
    needs: tuple[Need, ...]


def anchor_at(
    tokens: Sequence[int], keys: Sequence[str], namespace: str, block_size: int, position: int
) -> tuple[str, str, tuple[int, ...]]:
    """(anchor, parent, the anchor block's tokens) of ``position``; ``keys`` cover its full blocks."""
    full = position // block_size
    start = full * block_size
    if start == position:  # a block boundary: the anchor is that block's key
        if full == 0:
            raise ValueError("position 0 has no anchor")
        parent = keys[full - 2] if full >= 2 else namespace
        return keys[full - 1], parent, tuple(tokens[start - block_size : start])
    parent = keys[full - 1] if full >= 1 else namespace
    block = tuple(tokens[start:position])
    return block_key(parent, block), parent, block


def point_at(
    tokens: Sequence[int],
    keys: Sequence[str],
    namespace: str,
    block_size: int,
    layout: CacheLayout,
    position: int,
) -> RestorePoint:
    """The restore point at ``position`` (> 0) and the objects it needs under ``layout``."""
    anchor, parent, block = anchor_at(tokens, keys, namespace, block_size, position)
    needs: list[Need] = []
    if layout.has_state:
        needs.append(Need(STATE, object_key(STATE, anchor), parent, block))
    if layout.window is not None:
        needs.extend(window_needs(tokens, keys, namespace, block_size, layout.window, position))
    return RestorePoint(position, anchor, parent, tuple(needs))


def window_needs(
    tokens: Sequence[int],
    keys: Sequence[str],
    namespace: str,
    block_size: int,
    window: int,
    position: int,
) -> list[Need]:
    """The window objects covering ``[position - window, position)``, in position order."""
    bs = block_size
    full = position // bs
    needs = []
    for j in range(max(position - window, 0) // bs, full):
        parent = keys[j - 1] if j else namespace
        needs.append(
            Need(WINDOW, object_key(WINDOW, keys[j]), parent, tuple(tokens[j * bs : (j + 1) * bs]))
        )
    if full * bs < position:
        anchor, parent, block = anchor_at(tokens, keys, namespace, bs, position)
        needs.append(Need(WINDOW, object_key(WINDOW, anchor), parent, block))
    return needs


def candidates(
    tokens: Sequence[int],
    keys: Sequence[str],
    namespace: str,
    block_size: int,
    layout: CacheLayout,
    matched: int,
    marked: Sequence[int] = (),
) -> list[RestorePoint]:
    """Restore points at or below ``matched`` positions, deepest first (position 0 excluded).

    ``keys`` are the chain keys of the matched full blocks; ``matched`` may end inside
    the next block (a partial match). Candidates are the block boundaries, ``matched``,
    and the ``marked`` positions where restore-point objects are known to hang.
    """
    bs = block_size
    positions = {j * bs for j in range(1, min(matched // bs, len(keys)) + 1)}
    positions.add(matched)
    positions.update(p for p in marked if 0 < p <= matched)
    positions.discard(0)
    return [
        point_at(tokens, keys, namespace, bs, layout, p) for p in sorted(positions, reverse=True)
    ]


def marked_positions(
    tokens: Sequence[int],
    keys: Sequence[str],
    namespace: str,
    block_size: int,
    objects: Sequence[tuple[str, str, str, int]],
) -> list[int]:
    """Positions inside blocks at which the listed objects (key, kind, parent, token count) sit.

    An object marks position ``j * block_size + count`` when it hangs from the ``j``-th
    chain key (the namespace for ``j = 0``) and its key is the prompt's own anchor there.
    """
    parents = {namespace: 0, **{key: j + 1 for j, key in enumerate(keys)}}
    out = []
    for key, kind, parent, count in objects:
        j = parents.get(parent)
        if j is None or not 0 < count < block_size:
            continue
        start = j * block_size
        if (
            start + count <= len(tokens)
            and object_key(kind, block_key(parent, tokens[start : start + count])) == key
        ):
            out.append(start + count)
    return out


def interior_points(
    length: int, block_size: int, after: int = 0, limit: int = INTERIOR_POINTS
) -> list[int]:
    """Block boundaries in ``(after, length)`` on the coarsest power-of-two lattice giving ``limit``.

    Nested: the stride depends only on how many blocks ``length`` holds, and every
    stride divides the larger ones, so prompts sharing a prefix share points in it.
    """
    blocks = (length - 1) // block_size
    if blocks < 1:
        return []
    stride = 1
    while blocks // stride > limit:
        stride *= 2
    return [
        k * stride * block_size
        for k in range(1, blocks // stride + 1)
        if k * stride * block_size > after
    ]
