"""Which restore point a lookup settles on, and the KV matched cut back to it (hybrid layouts).

The KV chain tells how far a prompt matches; a model with sliding-window or recurrent
layers can be restored only where a restore point's objects are at hand
(``restore_points``). Candidates are the matched block boundaries, the match's end and
the points inside blocks that stored objects mark; what they need is asked of RAM, then
of the cold tier in one query, and the deepest complete one wins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import STATE
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.ports import ColdSource, KVCodec
from omlx.domain.cache.restore_points import RestorePoint, candidates, marked_positions

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FoundPoint:
    """The restore point a lookup settled on, with its objects (pinned under ``keys``)."""

    position: int
    keys: tuple[str, ...] = ()
    windows: tuple[Any, ...] = ()
    state: Any = None


class _Missing(Exception):
    """An object a restore point needs could not be read."""


class RestorePointFinder:
    def __init__(
        self,
        *,
        namespace: str,
        block_size: int,
        layout: CacheLayout,
        codec: KVCodec,
        hot: HotTier,
        cold: ColdSource | None,
        read_cold: Callable[[str, str], tuple[tuple[int, ...], Any] | None],
        remember: Callable[[str], None],
    ) -> None:
        self._ns, self._bs, self.layout = namespace, block_size, layout
        self._codec, self._hot, self._cold = codec, hot, cold
        self._read_cold, self._remember = read_cold, remember

    def find(self, tokens: Sequence[int], full_keys: list[str], matched: int) -> FoundPoint:
        """The deepest restore point at or below ``matched`` whose objects are all at hand.

        What the points need is asked of RAM, then of the cold tier in one query; the
        objects of the chosen point are read (verified) and pinned. Position 0 always works.
        """
        ns, bs = self._ns, self._bs
        parents = [ns, *full_keys[: matched // bs + 1]]
        objects = [
            (b.key, b.meta.kind, b.meta.parent_key, b.meta.token_count)
            for b in self._hot.point_children(parents)
        ]
        if self._cold is not None:
            objects += [
                (m.key, m.kind, m.parent_key, m.token_count)
                for m in self._cold.point_children(parents)
            ]
        marked = marked_positions(tokens, full_keys, ns, bs, objects)
        points = candidates(tokens, full_keys, ns, bs, self.layout, matched, marked)
        wanted = {n.key for p in points for n in p.needs}
        present = {k for k in wanted if k in self._hot}
        if self._cold is not None and wanted - present:
            try:
                present |= set(self._cold.present(sorted(wanted - present)))
            except OSError:
                log.exception("cold tier lookup of restore points failed; RAM only")
        for point in points:
            if all(n.key in present for n in point.needs):
                found = self._fetch(point)
                if found is not None:
                    return found
        return FoundPoint(0)

    def _fetch(self, point: RestorePoint) -> FoundPoint | None:
        windows: list[Any] = []
        state: Any = None
        pinned: list[str] = []
        try:
            for need in point.needs:
                block = self._hot.get(need.key)
                payload = block.payload if block is not None else self._fetch_cold(need)
                if payload is None:
                    raise _Missing(need.key)
                self._hot.pin((need.key,))
                pinned.append(need.key)
                if need.kind == STATE:
                    state = payload
                else:
                    windows.append(payload)
        except _Missing:
            self._hot.unpin(pinned)
            return None
        return FoundPoint(point.position, tuple(pinned), tuple(windows), state)

    def _fetch_cold(self, need: Any) -> Any | None:
        if self._cold is None:
            return None
        found = self._read_cold(need.key, need.parent)
        if found is None or found[0] != need.tokens:
            return None
        meta = BlockMeta(need.key, need.parent, self._ns, len(need.tokens), need.kind)
        self._hot.put(meta, need.tokens, found[1], self._codec.nbytes(found[1]), reused=True)
        self._remember(need.key)
        return found[1]

    def clamp(
        self,
        found: FoundPoint,
        keys: list[str],
        payloads: list[Any],
        partial: int,
        n_hot: int,
        cold_hits: int,
    ) -> tuple[list[str], list[Any], int, int, int]:
        """The KV matched, cut back to the restore point ``found``; dropped blocks unpinned.

        A point inside a block keeps that block's first positions (truncated).
        """
        bs = self._bs
        n_full = len(keys) - (1 if partial else 0)
        if found.position == n_full * bs + partial:
            return keys, payloads, partial, n_hot, cold_hits
        full, rest = divmod(found.position, bs)
        kept = full + (1 if rest else 0)
        self._hot.unpin(keys[kept:])
        keys, payloads = keys[:kept], payloads[:kept]
        if rest:
            payloads[-1] = self._codec.truncate(payloads[-1], rest)
        hot = min(n_hot, full)
        return keys, payloads, rest, hot, full - hot
