"""Warm restart over fakes: the hot set's order, the prefetch's rules (most recent first,
never evicting, never holding the tier while it reads, skipping what disk lost) and when
the hot set is recorded."""

from __future__ import annotations

import threading

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.hot_set import HotSet, hot_set_from_json, hot_set_order, hot_set_to_json
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import chain_keys
from omlx.domain.cache.prefetch import DONE, Prefetch
from omlx.domain.cache.reuse_eviction import ReuseLevelPolicy
from omlx.domain.cache.warm_restart import WarmRestart
from tests.fakes import FakeCodec, FakeColdSource, FakeHotSetStore
from tests.unit.test_prefix_cache import make, namespace, seq, serve

BS = 16
BLOCK_BYTES = 8 * BS  # FakeCodec: 8 bytes a position
OLD = seq(3 * BS + 5)  # yesterday's first conversation: 3 full blocks and a partial one
NEW = seq(2 * BS + 7, start=1000)  # the one used last: 2 full blocks and a partial one


def keys_of(prompt: list[int]) -> list[str]:
    """Its full blocks' keys, root first."""
    digest = namespace(BS).digest
    return chain_keys(digest, prompt[: len(prompt) // BS * BS], BS)


def yesterday(cold: FakeColdSource) -> HotSet:
    """Serve OLD then NEW, and record what RAM held (through a clean shutdown)."""
    pc = make(BS, cold=cold)
    store = FakeHotSetStore()
    warm = WarmRestart(
        namespace=pc.namespace.digest, hot=pc.hot, cold=cold, store=store, nbytes=len
    ).start()
    serve(pc, OLD)
    serve(pc, NEW)
    warm.close()
    saved = store.load()
    assert saved is not None
    return saved


def prefetch(saved: HotSet, hot: HotTier, cold: FakeColdSource, **kw) -> Prefetch:
    return Prefetch(saved, hot=hot, cold=cold, nbytes=FakeCodec().nbytes, batch_blocks=2, **kw)


def test_the_hot_set_lists_the_latest_conversation_first_each_chain_root_first() -> None:
    saved = yesterday(FakeColdSource())
    keys = [e.key for e in saved.entries]
    new, old = keys_of(NEW), keys_of(OLD)
    assert keys[:2] == new and keys[3:6] == old  # each followed by its partial block
    assert saved.entries[2].parent_key == new[-1] and saved.entries[2].token_count == 7
    assert saved.entries[6].parent_key == old[-1] and saved.entries[6].token_count == 5
    assert hot_set_from_json(hot_set_to_json(saved)) == saved


def test_the_hot_set_stops_at_the_budget_and_keeps_what_was_not_read_back() -> None:
    pc = make(BS, cold=FakeColdSource())
    serve(pc, OLD)
    serve(pc, NEW)
    recent = pc.hot.recent()
    two = hot_set_order(recent, 2 * BLOCK_BYTES)
    assert [e.key for e in two] == keys_of(NEW)  # never the middle of a chain
    whole = hot_set_order(recent, 1 << 30)
    # A shutdown during the prefetch: RAM's blocks first, then the rest of the old list.
    assert hot_set_order(recent[:3], 1 << 30, whole) == whole


def test_a_replay_after_a_warm_restart_is_served_from_ram() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    cold.read_recorded.clear()  # yesterday's own reads
    restarted = make(BS, cold=cold)
    warm = WarmRestart(
        namespace=restarted.namespace.digest,
        hot=restarted.hot,
        cold=cold,
        store=FakeHotSetStore(saved),
        nbytes=FakeCodec().nbytes,
    ).start()
    assert warm.wait(10)
    done = warm.progress()
    assert (done.state, done.blocks, done.planned_blocks, done.skipped) == (DONE, 7, 7, 0)
    assert done.bytes == done.planned_bytes == saved.nbytes
    reads = len(cold.gets)
    session = restarted.begin(NEW)
    hit = session.hit
    assert (hit.hot_hits, hit.cold_hits, hit.cached_tokens) == (2, 0, len(NEW) - 1)
    assert session.restore() == NEW[: len(NEW) - 1]
    session.close()
    assert len(cold.gets) == reads  # nothing read from disk for it
    assert not cold.read_recorded  # a prefetch is no use: disk recency untouched
    warm.close()


def test_prefetch_reads_the_latest_first_and_stops_when_ram_is_full() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    hot = HotTier(3 * BLOCK_BYTES + 8 * 7)  # room for NEW (its partial block too) and one more
    done = prefetch(saved, hot, cold).run(threading.Event())
    assert set(keys_of(NEW)) <= set(hot.keys()) and keys_of(OLD)[0] in hot
    assert keys_of(OLD)[1] not in hot
    assert done.ended == "budget full" and done.state == DONE


def test_prefetch_never_evicts_nor_displaces_what_requests_brought_in() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    hot = HotTier(4 * BLOCK_BYTES, ReuseLevelPolicy())
    request = BlockMeta("request-block", "root", "ns", BS)
    hot.put(request, tuple(range(BS)), ("request",) * BS, BLOCK_BYTES)
    first = saved.entries[0]
    taken = BlockMeta(first.key, first.parent_key, "ns", BS)
    hot.put(taken, tuple(NEW[:BS]), "read by a request", BLOCK_BYTES, reused=True)
    done = prefetch(saved, hot, cold).run(threading.Event())
    assert "request-block" in hot and hot.get(first.key).payload == "read by a request"  # type: ignore[union-attr]
    assert done.held == 1 and done.ended == "budget full"
    assert hot.stats().evictions == 0 and hot.stats().bytes <= hot.max_bytes
    # Prefetched blocks are the first to go when a request needs room.
    hot.put(BlockMeta("next", "request-block", "ns", BS), (0,) * BS, (0,) * BS, BLOCK_BYTES)
    assert "request-block" in hot and first.key in hot
    assert hot.stats().evictions == 1


def test_prefetch_waits_while_the_engine_is_busy() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    hot = HotTier(1 << 30)
    busy = threading.Event()
    busy.set()
    p = prefetch(saved, hot, cold, busy=busy.is_set)
    stop = threading.Event()
    runner = threading.Thread(target=p.run, args=(stop,))
    runner.start()
    runner.join(0.3)
    assert runner.is_alive() and len(hot) == 0 and p.progress().state == "running"
    busy.clear()
    runner.join(10)
    assert p.progress().blocks == 7


class SlowColdSource(FakeColdSource):
    """Each read waits for ``go``: a prefetch stuck on a slow disk."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()
        self.go = threading.Event()

    def get(self, key, parent_key, *, touch=True):
        self.reading.set()
        assert self.go.wait(10)
        return super().get(key, parent_key, touch=touch)


def test_requests_never_wait_for_a_read_in_flight() -> None:
    slow = SlowColdSource()
    slow.go.set()
    saved = yesterday(slow)
    slow.go.clear()
    slow.reading.clear()
    restarted = make(BS, cold=slow)
    stop = threading.Event()
    p = prefetch(saved, restarted.hot, slow)
    runner = threading.Thread(target=p.run, args=(stop,))
    runner.start()
    assert slow.reading.wait(10)  # the prefetch is inside a file read
    # A request meanwhile: looks RAM up and keeps its blocks without waiting on that read.
    done = threading.Event()

    def request() -> None:
        restarted.store(seq(2 * BS, start=5000), seq(2 * BS, start=5000))
        restarted.hot.get(keys_of(seq(2 * BS, start=5000))[0])
        done.set()

    threading.Thread(target=request).start()
    assert done.wait(5), "the request waited for the prefetch's read"
    stop.set()
    slow.go.set()
    runner.join(10)
    assert p.progress().ended == "stopped"


def test_blocks_missing_or_damaged_on_disk_are_skipped_and_counted() -> None:
    cold = FakeColdSource()
    saved = yesterday(cold)
    new, old = keys_of(NEW), keys_of(OLD)
    del cold.blocks[new[1]]  # lost: its batch's partial block goes with it
    meta, tokens, _ = cold.blocks[old[2]]
    cold.blocks[old[2]] = (meta, tokens, b"not a block")
    hot = HotTier(1 << 30)
    done = prefetch(saved, hot, cold).run(threading.Event())
    assert new[0] in hot and new[1] not in hot and old[:2] == [k for k in old if k in hot]
    assert done.skipped == 3 and done.blocks == 4 and done.ended == ""
    assert old[2] not in cold.blocks  # a damaged block is dropped, as for a request


def test_the_hot_set_is_recorded_when_it_changed_and_periodically() -> None:
    cold = FakeColdSource()
    pc = make(BS, cold=cold)
    store = FakeHotSetStore()
    warm = WarmRestart(
        namespace=pc.namespace.digest,
        hot=pc.hot,
        cold=cold,
        store=store,
        nbytes=len,
        record_every=0.05,
    ).start()
    assert warm.wait(5)
    assert not warm.record()  # nothing used yet
    serve(pc, NEW)
    deadline = threading.Event()
    for _ in range(100):  # the periodic record (a crash after it keeps this list)
        if store.saves:
            break
        deadline.wait(0.05)
    assert store.saves and len(store.saves[-1].entries) == 3
    saves = len(store.saves)
    deadline.wait(0.2)
    assert len(store.saves) == saves  # unchanged: not written again
    warm.close()
