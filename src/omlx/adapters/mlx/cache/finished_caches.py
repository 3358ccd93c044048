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
    kept cache gets views of that cache's arrays cut at the prefix: the batcher copies
    them into its batch without writing to them, so the kept cache stays whole for a
    later turn (a replay, a sibling branch). Plain KV layouts only: a state cache cannot
    be cut at a prefix. Exact mode's quantized rows (``ExactKVCache``) are cut alike: the
    views share their codes, which the batcher copies as it copies plain KV.
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

    def take(self, prompt: Sequence[int], prefix: int) -> list[Any] | None:
        """Views of a kept cache holding ``prompt[:prefix]``, cut there; None when none does."""
        wanted = tuple(prompt[:prefix])
        for i in range(len(self._kept) - 1, -1, -1):
            tokens, cache, _ = self._kept[i]
            if len(tokens) >= prefix and tokens[:prefix] == wanted:
                self._kept.append(self._kept.pop(i))  # most recently used last
                return [_view(layer, prefix) for layer in cache]
        return None

    def clear(self) -> None:
        self._kept.clear()


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

    from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import ExactKVCache

    kinds = (KVCache, ExactKVCache)
    return bool(cache) and all(type(c) in kinds and c.keys is not None for c in cache)
