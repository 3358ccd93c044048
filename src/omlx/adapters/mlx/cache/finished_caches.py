"""The last few finished requests' caches, for the next turn of a conversation to continue.

The MLX side of the domain's ``KeptCaches`` port: the composition root hands one to the
prefix cache, whose per-request sessions take from it and keep into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class FinishedCaches:
    """The last few finished requests' caches, for the next turn to continue from.

    An agent's next turn extends its previous prompt and reply; restoring that prefix
    from the hot tier's blocks copies all of it into fresh arrays first, while the
    finished request's own cache already holds it. A request whose restored prefix (as
    the prefix cache matched it: blocks pinned, capture keyed as usual) lies within a
    kept cache takes that cache's arrays, cut at the prefix. Plain KV rows are handed
    over (``RestoredKVCache``: a lone row joins the batch without a copy and its tail is
    written in place; views cost the batcher's copy and then the batch cache's growth,
    two copies of the prefix, more than a restore from blocks): the entry leaves, and the
    request's own cache, which holds it, is kept when it finishes. Exact mode's quantized
    rows (``ExactKVCache``) are views sharing their codes, which the batcher copies: that
    entry stays whole for a later turn (a replay, a sibling branch). Plain KV layouts
    only: a state cache cannot be cut at a prefix.
    """

    def __init__(self, entries: int = 2, max_bytes: int = 2 << 30) -> None:
        self.entries = entries  # 0 turns keeping off
        self.max_bytes = max_bytes
        self._kept: list[tuple[tuple[int, ...], list[Any], int]] = []  # oldest first

    @property
    def nbytes(self) -> int:
        return sum(n for _, _, n in self._kept)

    def keep(self, tokens: Sequence[int], cache: list[Any]) -> None:
        if self.entries <= 0 or not _cuttable(cache) or cache[0].offset != len(tokens):
            return
        nbytes = sum(c.nbytes for c in cache)
        if nbytes > self.max_bytes:
            return
        key = tuple(tokens)
        self._kept = [e for e in self._kept if e[0] != key]
        self._kept.append((key, cache, nbytes))
        while len(self._kept) > self.entries or self.nbytes > self.max_bytes:
            self._kept.pop(0)

    def fits(self, nbytes: int) -> bool:
        return self.entries > 0 and nbytes <= self.max_bytes

    def take(self, prompt: Sequence[int], prefix: int) -> list[Any] | None:
        """A kept cache holding ``prompt[:prefix]``, cut there; None when none does."""
        i = self._find(prompt[:prefix])
        if i is None:
            return None
        entry = self._kept.pop(i)
        cache = entry[1]
        if _exact(cache):
            self._kept.append(entry)  # most recently used last
            return [_view(layer, prefix) for layer in cache]
        return [_handed_over(layer, prefix) for layer in cache]

    def held_for(self, prefix: Sequence[int]) -> int:
        i = self._find(prefix) if prefix else None
        if i is None or _exact(self._kept[i][1]):  # a view: the entry stays kept
            return 0
        return self._kept[i][2]

    def shrink(self, max_bytes: int, spare: Sequence[int] = ()) -> None:
        i = self._find(spare) if self.held_for(spare) else None
        spared = self._kept[i] if i is not None else None
        excess = self.nbytes - (spared[2] if spared is not None else 0) - max_bytes
        kept = []
        for entry in self._kept:  # oldest first
            if excess > 0 and entry is not spared:
                excess -= entry[2]
                continue
            kept.append(entry)
        self._kept = kept

    def clear(self) -> None:
        self._kept.clear()

    def _find(self, prefix: Sequence[int]) -> int | None:
        """The newest entry holding ``prefix`` (``take``'s pick), or None."""
        wanted = tuple(prefix)
        n = len(wanted)
        for i in range(len(self._kept) - 1, -1, -1):
            tokens = self._kept[i][0]
            if len(tokens) >= n and tokens[:n] == wanted:
                return i
        return None


def _exact(cache: list[Any]) -> bool:
    from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import ExactKVCache

    return any(isinstance(c, ExactKVCache) for c in cache)


def _handed_over(layer: Any, prefix: int) -> Any:
    """A restored cache over ``layer``'s arrays holding its first ``prefix`` positions."""
    from omlx.adapters.mlx.cache.restored_cache import with_room

    cache = with_room(layer.keys, layer.values, prefix)
    layer.keys = layer.values = None  # the batch holds the only reference: writes in place
    return cache


def _view(layer: Any, prefix: int) -> Any:
    """A cache of ``layer``'s class over its arrays, holding its first ``prefix`` positions."""
    from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import ExactKVCache

    if isinstance(layer, ExactKVCache):
        view = ExactKVCache(group_size=layer.group_size, bits=layer.bits)
        view.kv_dtype = layer.kv_dtype
    else:
        from mlx_lm.models.cache import KVCache

        view = KVCache()
    view.keys, view.values, view.offset = layer.keys, layer.values, prefix
    return view


def _cuttable(cache: list[Any]) -> bool:
    from mlx_lm.models.cache import KVCache

    from omlx.adapters.mlx.cache.restored_cache import RestoredKVCache
    from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import ExactKVCache

    kinds = (KVCache, RestoredKVCache, ExactKVCache)
    return bool(cache) and all(type(c) in kinds and c.keys is not None for c in cache)
