"""``CacheControls`` over the fakes of the cache's ports: pins, explain, export then import,
clear; and a request's prompt hashed and looked up once between its arrival and its engine.

The prefix caches here run a real ``ColdTier`` over a fake index, store and write queue,
so what reaches the index is counted as a server's shared PostgreSQL index would see it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest

from omlx.app.cache_controls.controls import TurnControls
from omlx.app.cache_controls.service import CacheControls, ImportRefused
from omlx.domain.cache import matcher, probe
from omlx.domain.cache.cold_tier import ColdTier, RecencyBuffer
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.generation import GenerationRequest
from tests.fakes import FakeBlockIndex, FakeBlockSink, FakeBlockStore, FakeClock, FakeCodec
from tests.unit.test_prefix_cache import make, namespace, seq, serve

BS = 4


@dataclass
class Disk:
    index: FakeBlockIndex
    store: FakeBlockStore
    sink: FakeBlockSink


def cache_on_disk(clock: FakeClock | None = None) -> tuple[PrefixCache, Disk]:
    """A prefix cache whose cold tier is the real one over fakes (one namespace)."""
    clock = clock or FakeClock()
    store, index = FakeBlockStore(), FakeBlockIndex()
    sink = FakeBlockSink(store, index, clock)
    ns = namespace(BS)
    cold = ColdTier(
        ns,
        store,
        index,
        sink,
        FakeCodec().decode,
        clock,
        RecencyBuffer(index, clock),
        check=FakeCodec().check,
    )
    pc = make(BS, cold=cold)  # type: ignore[arg-type]
    return pc, Disk(index, store, sink)


def controls_of(pc: PrefixCache) -> CacheControls:
    return CacheControls(pc, lambda tokens: " ".join(map(str, tokens)))


def test_pins_are_made_listed_and_dropped_per_tenant() -> None:
    pc, _ = cache_on_disk()
    controls = controls_of(pc)
    prompt = seq(10)
    serve(pc, prompt)  # the default tenant's blocks
    view = controls.pin(prompt, 600)
    assert view.held_blocks == len(view.pin.keys) == 3  # two full blocks and the partial one
    assert 0 < view.ttl_left <= 600
    theirs = controls.pin(prompt, 60, tenant="a")  # tenant a's own chain: nothing held yet
    assert theirs.held_blocks == 0 and theirs.pin.id != view.pin.id
    assert [v.pin.id for v in controls.pins(None)] == [view.pin.id]
    assert [v.pin.id for v in controls.pins("a")] == [theirs.pin.id]
    assert not controls.unpin(view.pin.id, "a")  # another tenant's pin is unknown to it
    assert controls.unpin(view.pin.id, None) and controls.pins(None) == []


def test_honour_pins_what_a_turn_asks_and_nothing_for_no_store() -> None:
    pc, _ = cache_on_disk()
    controls = controls_of(pc)
    prompt = seq(12)
    serve(pc, prompt)
    assert controls.honour(prompt, TurnControls(retention=60.0, store=False)) == 0
    assert controls.pins(None) == []
    controls.honour(prompt, TurnControls(retention=60.0, session_key="s1"))
    (view,) = controls.pins(None)
    assert (view.pin.source, view.pin.group, view.pin.tokens) == (
        "prompt_cache_retention",
        "s1",
        12,
    )


def test_explain_says_what_each_tier_holds_and_changes_nothing() -> None:
    pc, disk = cache_on_disk()
    controls = controls_of(pc)
    stored = seq(13)
    serve(pc, stored)
    disk.sink.drain()
    follow = [*stored[:9], 999, 998, 997]
    in_ram = controls.explain(follow, None)
    assert (in_ram.cached, in_ram.tier, in_ram.full_hit) == (9, "hot", False)
    assert in_ram.before.endswith("8") and in_ram.prompt_next.startswith("999")
    pc.clear()  # RAM empty: the blocks are on disk
    reads_before = list(disk.store.reads)
    on_disk = controls.explain(follow, None)
    # The index lists the tokens of the block the prompt leaves part-way: counted to the
    # token, as a request would restore it, with no file read.
    assert (on_disk.cached, on_disk.tier) == (9, "ssd")
    assert on_disk.cached_next.startswith("9") and on_disk.outcome == "changed"
    assert len(pc.hot) == 0  # explaining promoted nothing
    assert disk.store.reads == reads_before


def test_export_then_import_moves_a_prefix_to_another_server() -> None:
    pc, disk = cache_on_disk()
    prompt = seq(14)
    serve(pc, prompt)
    disk.sink.drain()
    made = controls_of(pc).export(prompt, None)
    assert made.tokens == 14
    archive = b"".join(made.chunks)
    other, other_disk = cache_on_disk()
    imported = controls_of(other).import_(io.BytesIO(archive), None, 100)
    assert (imported.blocks, imported.written, imported.present, imported.tokens) == (4, 4, 0, 14)
    assert imported.refused == {} and len(other_disk.index.blocks) == 4  # written, not queued
    again = controls_of(other).import_(io.BytesIO(archive), None, 100)
    assert (again.written, again.present) == (0, 4)
    session = other.begin([*prompt, 500])  # served from the imported files
    assert session.cached_tokens == 14 and session.restore() == prompt
    session.close()
    with pytest.raises(ImportRefused, match="not the next block"):
        controls_of(other).import_(io.BytesIO(archive), "tenant-b", 100)  # another tenant's chain


def test_an_import_reports_blocks_the_writer_refused() -> None:
    pc, disk = cache_on_disk()
    prompt = seq(14)
    serve(pc, prompt)
    disk.sink.drain()
    archive = b"".join(controls_of(pc).export(prompt, None).chunks)
    other, other_disk = cache_on_disk()
    other_disk.sink.accept = False  # a full queue that never drains
    imported = controls_of(other).import_(io.BytesIO(archive), None, 100)
    assert (imported.written, imported.present, imported.refused) == (0, 0, {"queue_full": 4})
    assert other_disk.index.blocks == {}


def test_clear_drops_ram_and_what_was_on_disk_is_written_again() -> None:
    pc, disk = cache_on_disk()
    controls = controls_of(pc)
    prompt = seq(9)
    serve(pc, prompt)
    disk.sink.drain()
    assert controls.clear() == len(pc.hot.keys()) + 3  # the hot tier had three blocks
    disk.index.blocks.clear()  # what clearing the SSD tier's rows and files does
    assert serve(pc, prompt) == 0
    assert len(disk.sink.queue) == 3  # forgotten as stored, so queued for disk again


def test_a_request_hashes_its_prompt_and_asks_the_index_once(monkeypatch) -> None:
    pc, disk = cache_on_disk()
    controls = controls_of(pc)
    first = seq(28)  # seven whole blocks
    serve(pc, first)
    disk.sink.drain()
    pc.clear()  # the next turn finds its prefix on disk: the index must be asked
    hashed: list[int] = []
    for module in (probe, matcher):
        for name in ("chain_keys", "iter_chain_keys"):
            real = getattr(module, name, None)
            if real is not None:

                def counted(*args, _real=real, **kwargs):
                    hashed.append(len(args[1]))
                    return _real(*args, **kwargs)

                monkeypatch.setattr(module, name, counted)
    asked = disk.index.lookups, disk.index.listings
    follow = [*first, 700, 701, 702]
    # The request path: the report's probe, the request built with it, the engine's begin.
    found = controls.look(follow, None)
    request = controls.apply(GenerationRequest(tuple(follow), 8), TurnControls(), found)
    session = pc.begin(request.prompt_tokens, probed=request.cache_probe)
    assert session.cached_tokens == 28 and session.restore() == first
    session.close()
    assert hashed == [28]  # the prompt's whole blocks, hashed once (by the probe)
    # (A trailing partial block read from disk would ask for its own row too, as any file
    # read does: its name and checksum.)
    assert disk.index.lookups - asked[0] == 1  # one query for the chain's rows
    # One listing of where the whole blocks end (the nearest children, then the recent).
    assert disk.index.listings - asked[1] == 2


def test_a_stale_probe_is_asked_again_rather_than_trusted() -> None:
    pc, disk = cache_on_disk()
    clock = pc._clock  # the probe's and the lookup's
    controls = controls_of(pc)
    first = seq(8)
    found = controls.look([*first, 9], None)  # nothing stored yet
    serve(pc, first)
    disk.sink.drain()
    pc.clear()
    clock.advance(matcher.PROBE_FRESH_S + 1)  # the request waited in the queue meanwhile
    session = pc.begin([*first, 9], probed=found)
    assert session.cached_tokens == 8  # written since the probe, and found
    session.close()
