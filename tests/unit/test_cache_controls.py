"""The cache's controls over fakes: the read-only probe, no-store sessions, pinned prefixes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omlx.domain.cache.pins import PinRefused
from tests.fakes import FakeClock, FakeColdSource
from tests.unit.test_prefix_cache import best_prefix, make, seq, serve


def test_the_probe_tells_tier_and_depth_and_changes_nothing() -> None:
    cold = FakeColdSource()
    pc = make(16, cold=cold)
    first = seq(3 * 16 + 5)
    serve(pc, first)
    follow = first + seq(20, 900)
    found = pc.probe(follow)
    assert (found.tokens, found.tier, found.full_hit) == (53, "hot", False)
    assert found.stored_next == ()  # the stored block ends where the prompt goes on
    before = (pc.hot.stats(), list(cold.touched), list(cold.read_recorded), list(cold.gets))
    pc.hot.clear()
    on_disk = pc.probe(follow)
    # Whole blocks by key, and the trailing partial one known by its key (no file read).
    assert (on_disk.tokens, on_disk.tier, on_disk.ssd_tokens) == (53, "ssd", 53)
    assert (list(cold.touched), list(cold.read_recorded), list(cold.gets)) == before[1:]
    assert pc.hot.stats().hits == before[0].hits  # nothing counted, nothing promoted
    assert len(pc.hot) == 0


def test_the_probe_shows_what_the_cache_holds_where_the_prompt_left_it() -> None:
    pc = make(16)
    stored = seq(40)
    serve(pc, stored)
    changed = [*seq(20), 7777, *seq(19, 21)]
    found = pc.probe(changed)
    assert found.tokens == 20 and found.stored_next[:3] == (20, 21, 22)
    assert pc.probe(stored).full_hit


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([4, 16]), st.lists(st.integers(0, 99), max_size=90), st.integers(0, 90))
def test_the_probe_agrees_with_a_lookup_on_ram(bs: int, stored: list[int], cut: int) -> None:
    pc = make(bs)
    pc.store(stored, list(stored))
    query = [*stored[:cut], 1000]
    assert pc.probe(query).tokens == best_prefix(query, [stored])


def test_a_no_store_request_restores_but_keeps_nothing_and_records_no_recency() -> None:
    cold = FakeColdSource()
    pc = make(16, cold=cold)
    first = seq(40)
    serve(pc, first)
    pc.hot.clear()
    puts, touched, recorded = list(cold.puts), list(cold.touched), list(cold.read_recorded)
    longer = first + seq(30, 500)
    session = pc.begin(longer, store=False)
    assert session.cached_tokens == 40  # two whole blocks and the partial one, from disk
    assert session.restore() == longer[:40]
    session.prefilled(lambda: list(longer[:64]), 64)
    session.finished(longer, list(longer))
    assert (cold.puts, cold.touched, cold.read_recorded) == (puts, touched, recorded)
    assert len(pc.hot) == 0  # nothing promoted, so nothing evicted for it
    assert pc.hot.stats().pinned == 0
    # The same request with the default (store) keeps its blocks.
    again = pc.begin(longer)
    again.restore()
    again.finished(longer, list(longer))
    assert len(cold.puts) > len(puts) and len(pc.hot) > 0


def test_pins_protect_a_prefix_from_eviction_until_they_expire() -> None:
    clock = FakeClock()
    pc = make(4, hot_bytes=10 * 4 * 8)  # FakeCodec: 8 bytes a token; room for 10 blocks
    pc.pins._clock = clock  # the book reads this clock (the facade was built with another)
    kept = seq(16)
    serve(pc, kept)
    pin = pc.pins.pin(kept, ttl=300, source="api")
    assert pin.tokens == 16 and len(pin.keys) == 4
    for start in range(100, 1000, 40):  # traffic that would push everything old out
        serve(pc, seq(16, start))
    assert pc.probe([*kept, 5]).tokens == 16
    assert pc.pins.pin(kept, ttl=600, source="api").id == pin.id  # extended, not doubled
    assert len(pc.pins.pins()) == 1
    clock.advance(601)
    assert pc.pins.pins() == []
    assert pc.hot.stats().pinned == 0
    for start in range(2000, 3000, 40):
        serve(pc, seq(16, start))
    assert pc.probe([*kept, 5]).tokens == 0


def test_pins_stay_within_their_share_and_unpin_by_id() -> None:
    pc = make(4, hot_bytes=10 * 4 * 8, pin_share=0.5)
    serve(pc, seq(16))
    pin = pc.pins.pin(seq(16), ttl=60, source="api")
    with pytest.raises(PinRefused, match="pinned share"):
        pc.pins.pin(seq(12, 500), ttl=60, source="api")  # 4 + 3 blocks > 5
    with pytest.raises(PinRefused, match="ttl"):
        pc.pins.pin(seq(4, 900), ttl=0, source="api")
    assert pc.pins.unpin(pin.id) and not pc.pins.unpin(pin.id)
    assert pc.hot.stats().pinned == 0


def test_an_empty_ram_tier_is_no_way_around_the_pinned_share() -> None:
    # Nothing served yet: the share is counted from the model's cost of a block (32 bytes).
    pc = make(4, hot_bytes=10 * 4 * 8, pin_share=0.5, block_bytes=32)
    assert pc.hot.stats().blocks == 0
    with pytest.raises(PinRefused, match="pinned share"):
        pc.pins.pin(seq(4 * 8, 100), ttl=60, source="api")  # 8 blocks x 32 B > 160 B
    pc.pins.pin(seq(4 * 5, 100), ttl=60, source="api")  # 5 blocks: exactly the share


def test_a_tenant_holds_at_most_its_count_of_pins() -> None:
    pc = make(4, pin_share=1.0)
    pc.pins.max_pins = 3
    for start in range(3):
        pc.pins.pin(seq(4, 100 * start), ttl=60, source="api", tenant="alice")
    pc.pins.pin(seq(4, 0), ttl=120, source="api", tenant="alice")  # the same prefix: extended
    with pytest.raises(PinRefused, match=r"holds 3 pins, the most one may \(3\)"):
        pc.pins.pin(seq(4, 900), ttl=60, source="api", tenant="alice")
    pc.pins.pin(seq(4, 900), ttl=60, source="api", tenant="bob")  # another tenant's count
