"""Whose work a restore used: this server's, a peer's on the shared index, or not known.

Each block carries the ``server_id`` of the server that computed it (``BlockMeta.computed_by``,
kept in its index row), so servers sharing a cold tier can tell a prefix they restored from
their own RAM or files from one a peer computed: what a proxy's session affinity buys
(docs/multi-machine.md). Rows written before the record was kept, and imported blocks, say
nothing: ``unknown``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

SELF, PEER, UNKNOWN = "self", "peer", "unknown"
ORIGINS = (SELF, PEER, UNKNOWN)


def origin_of(computed_by: str | None, here: str) -> str:
    """``self`` when ``here`` (this server's id) computed the block, ``peer`` when another
    named server did, ``unknown`` when nobody is recorded."""
    if not computed_by:
        return UNKNOWN
    return SELF if computed_by == here else PEER


class RestoredTokens:
    """Restored prompt tokens counted by (tier, origin); thread-safe, cumulative."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def add(self, parts: Iterable[tuple[str, str, int]]) -> None:
        """Count each ``(tier, origin, tokens)`` of one lookup."""
        with self._lock:
            for tier, origin, tokens in parts:
                if tokens:
                    self._counts[(tier, origin)] = self._counts.get((tier, origin), 0) + tokens

    def read(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)
