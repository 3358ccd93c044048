"""Priming over fakes: after a warm restart's prefetch, the latest conversation is kept as
its finished request kept it, and its next turn continues it; nothing is kept when a
request finished first, for a layout kept caches cannot hold, or past their budget."""

from __future__ import annotations

from collections.abc import Sequence

from omlx.domain.cache.hot_set import HotSet
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.cache.prime import PRIMED, latest_conversation
from omlx.domain.cache.warm_restart import WarmRestart
from tests.fakes import FakeCodec, FakeColdSource, FakeHotSetStore, FakeKeptCaches
from tests.unit.test_prefix_cache import make, seq
from tests.unit.test_warm_restart import BS, NEW, OLD, keys_of, yesterday


def restart(
    saved: HotSet, cold: FakeColdSource, kept: FakeKeptCaches, **kw: object
) -> tuple[PrefixCache, list[str]]:
    """A start that prefetches ``saved``, its primer run at once (an idle engine)."""
    pc = make(BS, cold=cold, kept=kept, **kw)
    store = FakeHotSetStore()
    store.save(saved)
    outcomes: list[str] = []

    def primer(keys: Sequence[str]) -> None:
        outcomes.append(pc.prime(keys))

    warm = WarmRestart(
        namespace=pc.namespace.digest,
        hot=pc.hot,
        cold=cold,
        store=store,
        nbytes=FakeCodec().nbytes,
        prime=primer,
    ).start()
    assert warm.wait(5)
    warm.close()
    return pc, outcomes


def test_the_latest_conversation_is_its_chain_root_first_to_its_partial_block() -> None:
    saved = yesterday(FakeColdSource())
    latest = latest_conversation(saved.entries)
    assert [e.key for e in latest[:2]] == keys_of(NEW) and latest[2].token_count == 7
    assert len(latest) == 3  # OLD's chain starts again at the root: another conversation


def test_a_warm_restart_keeps_the_latest_conversation_and_its_next_turn_continues_it() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    kept = FakeKeptCaches()
    pc, outcomes = restart(saved, cold, kept)
    assert outcomes == [PRIMED]
    # What its finished request kept: every token, to the partial block's end.
    assert kept.kept == [(tuple(NEW), NEW)]
    stats = pc.hot.stats()
    assert stats.hits == 0 and pc.hot.version == 0  # priming is no use of the blocks
    next_turn = [*NEW, *seq(5, start=5000)]
    session = pc.begin(next_turn)
    assert session.restore() == NEW and session.continued and kept.taken == 1
    session.close()


def test_a_request_that_finished_first_is_not_displaced() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    kept = FakeKeptCaches()
    kept.keep(OLD, list(OLD))  # a request for OLD ended before the engine was idle
    _, outcomes = restart(saved, cold, kept)
    assert outcomes == ["a request came first"] and kept.kept == [(tuple(OLD), OLD)]


def test_nothing_is_kept_past_the_kept_caches_budget_or_for_a_state_layout() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    small = FakeKeptCaches(max_bytes=8 * len(NEW) - 1)
    _, outcomes = restart(saved, cold, small)
    assert outcomes == [f"{8 * len(NEW)} bytes would not be kept"] and small.kept == []
    off = FakeKeptCaches(entries=0)
    _, outcomes = restart(saved, cold, off)
    assert outcomes[0].endswith("would not be kept") and off.kept == []
    hybrid = FakeKeptCaches()
    _, outcomes = restart(saved, cold, hybrid, layout=CacheLayout(has_state=True))
    assert outcomes == ["no kept caches for this layout"] and hybrid.kept == []
