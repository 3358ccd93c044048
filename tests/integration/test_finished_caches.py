"""The kept finished caches as the memory guard sees them: what a next turn will take over,
and giving back the others, oldest first, over real mlx-lm caches."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from omlx.adapters.mlx.cache.finished_caches import FinishedCaches


def finished(tokens: list[int]) -> list[KVCache]:
    """A one-layer cache holding ``tokens``' positions, as a finished request leaves it."""
    layer = KVCache()
    shape = (1, 2, len(tokens), 8)
    layer.update_and_fetch(mx.zeros(shape), mx.zeros(shape))
    return [layer]


def test_the_cache_a_next_turn_takes_over_is_counted_for_it_and_spared() -> None:
    caches = FinishedCaches(entries=3)
    a, b, c = list(range(1, 41)), list(range(100, 130)), list(range(200, 220))
    for tokens in (a, b, c):
        caches.keep(tokens, finished(tokens))
    each = caches.nbytes // 3  # one growth step each, whatever their lengths
    assert caches.held_for(a[:30]) == each
    assert caches.held_for(()) == 0 and caches.held_for([7, 7]) == 0
    caches.shrink(each, spare=a[:30])  # the others above one cache's bytes: the oldest goes
    assert caches.held_for(b[:5]) == 0 and caches.held_for(c[:5]) == each
    caches.shrink(0, spare=a[:30])
    assert caches.nbytes == each
    restored = caches.take([*a, 5, 6], 30)
    assert restored is not None and restored[0].offset == 30
    assert caches.nbytes == 0  # handed over whole


def test_without_a_spare_every_kept_cache_may_go() -> None:
    caches = FinishedCaches(entries=2)
    for tokens in (list(range(1, 20)), list(range(50, 70))):
        caches.keep(tokens, finished(tokens))
    caches.shrink(caches.nbytes // 2)
    assert caches.held_for(list(range(50, 60))) > 0 and caches.held_for(list(range(1, 5))) == 0
    caches.shrink(0)
    assert caches.nbytes == 0
