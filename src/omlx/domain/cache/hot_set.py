"""The hot set: what RAM held of one namespace, recorded so a restart can read it back.

InnoDB dumps its buffer pool's page list at shutdown and loads it at start; PostgreSQL's
autoprewarm does the same. Here the list is of the hot tier's objects, grouped into
conversations: most recently used conversation first, each chain root first (a block is
of use only once every block before it is in RAM), each restore-point object just after
the block it sits on. It names objects by key and says how to check them on a read
(parent key, kind, token count); the bytes stay in the cold tier's files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from omlx.domain.cache.blocks import HotSet, HotSetEntry
from omlx.domain.cache.hot_tier import HotBlock
from omlx.domain.cache.keys import KV, STATE, WINDOW

FORMAT_VERSION = 1
# Kinds a hot set records. Image rows are read through the vision model's own codec, and
# external (library) blocks are no server's conversations: neither is prefetched.
RECORDED_KINDS = (KV, STATE, WINDOW)

__all__ = ["HotSet", "HotSetEntry", "hot_set_from_json", "hot_set_order", "hot_set_to_json"]


def entry_of(block: HotBlock) -> HotSetEntry:
    m = block.meta
    return HotSetEntry(m.key, m.parent_key, m.kind, m.token_count, block.nbytes)


def hot_set_order(
    recent_first: Sequence[HotBlock],
    max_bytes: int,
    carried: Iterable[HotSetEntry] = (),
) -> tuple[HotSetEntry, ...]:
    """The hot set of blocks listed most recently used first (``HotTier.recent``).

    Walking that list, the first block of a conversation met is its most recently used
    (a lookup touches a chain root first, tail last): its whole chain, root first, goes
    out then. ``carried``: entries of the previous hot set not read back yet (a shutdown
    during the prefetch), kept after what RAM holds. At most ``max_bytes``: the list ends
    at the first entry past it, so no chain is cut in its middle and resumed later.
    """
    held = {b.key: b for b in recent_first if b.meta.kind in RECORDED_KINDS}
    points: dict[str, list[HotBlock]] = {}  # a point's parent key -> its objects in RAM
    for b in held.values():
        if b.meta.kind != KV:
            points.setdefault(b.meta.parent_key, []).append(b)
    out: list[HotSetEntry] = []
    emitted: set[str] = set()
    total = 0

    def emit(entry: HotSetEntry) -> bool:
        nonlocal total
        if entry.key in emitted:
            return True
        if total + entry.nbytes > max_bytes:
            return False
        out.append(entry)
        emitted.add(entry.key)
        total += entry.nbytes
        return True

    for block in recent_first:
        if block.key not in held or block.key in emitted:
            continue
        chain = [block]
        if block.meta.kind == KV:
            while (parent := held.get(chain[-1].meta.parent_key)) is not None:
                if parent.key in emitted or parent.meta.kind != KV:
                    break
                chain.append(parent)
        for b in reversed(chain):
            if not emit(entry_of(b)):
                return tuple(out)
            # A point at the end of this block hangs from the block's parent key.
            for point in points.get(b.meta.parent_key, ()) if b.meta.kind == KV else ():
                if not emit(entry_of(point)):
                    return tuple(out)
    for entry in carried:
        if not emit(entry):
            break
    return tuple(out)


def hot_set_to_json(hot_set: HotSet) -> dict[str, Any]:
    """A JSON object of ``hot_set`` (compact: one short list per entry)."""
    return {
        "format": FORMAT_VERSION,
        "namespace": hot_set.namespace,
        "recorded_at": hot_set.recorded_at,
        "entries": [
            [e.key, e.parent_key, e.kind, e.token_count, e.nbytes] for e in hot_set.entries
        ],
    }


def hot_set_from_json(obj: Any) -> HotSet:
    """The hot set a ``hot_set_to_json`` object holds; ValueError for anything else."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_VERSION:
        raise ValueError("not a hot set of this format")
    try:
        entries = tuple(
            HotSetEntry(str(k), str(p), str(kind), int(n), int(b))
            for k, p, kind, n, b in obj["entries"]
        )
        return HotSet(str(obj["namespace"]), float(obj["recorded_at"]), entries)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed hot set: {exc}") from None
