"""Blocks the writer's full queue cannot take are deferred, not dropped (issue 38).

A first prompt computed faster than the disk writes outruns the bounded queue; RAM still
holds those blocks and every later turn reuses them from there, so before this nothing
queued them again and a restart cut every later restore at the first one. Over fakes: a
cold source whose writer has room for a set number of blocks.
"""

from __future__ import annotations

from omlx.domain.cache.keys import chain_keys
from tests.fakes import FakeColdSource
from tests.unit.test_prefix_cache import make, seq, serve

BS = 16


def test_blocks_a_full_queue_could_not_take_reach_disk_oldest_first_as_room_comes() -> None:
    cold = FakeColdSource()
    cold.room = 3
    pc = make(BS, cold=cold)
    prompt = seq(10 * BS)
    keys = chain_keys(pc.namespace.digest, prompt, BS)
    pc.store(prompt, list(prompt))
    assert cold.puts == keys[:3] and cold.refused == []  # the rest waits, nothing is dropped
    assert pc.stats().deferred_blocks == 7

    assert pc.write_deferred() == 0  # still no room: nothing asked of the writer
    cold.room = 4
    assert pc.write_deferred() == 4
    cold.room = None
    assert pc.write_deferred() == 3
    assert cold.puts == keys  # in chain order: a restore reads a chain from its head
    stats = pc.stats()
    assert stats.deferred_written == 7 and stats.queued_blocks == 10

    restarted = make(BS, cold=cold)  # RAM gone: the whole prompt comes back from disk
    assert serve(restarted, prompt) == len(prompt) - 1


def test_a_later_chunk_queues_after_the_blocks_deferred_before_it() -> None:
    cold = FakeColdSource()
    cold.room = 2
    pc = make(BS, cold=cold)
    first = seq(5 * BS)
    pc.store(first, list(first))
    cold.room = 5
    turn = first + seq(4 * BS, start=1000)  # the next turn: the first prompt and its tail
    pc.store(turn, list(turn))
    keys = chain_keys(pc.namespace.digest, turn, BS)
    assert cold.puts == keys[:7]  # the first prompt's three deferred, then two of the tail
    cold.room = None
    pc.write_deferred()
    assert cold.puts == keys


def test_a_deferred_block_that_left_ram_is_let_go() -> None:
    cold = FakeColdSource()
    cold.room = 0
    pc = make(BS, cold=cold)
    prompt = seq(4 * BS)
    pc.store(prompt, list(prompt))
    pc.hot.clear()  # evicted before the writer had room
    cold.room = None
    assert pc.write_deferred() == 0 and cold.puts == []
    pc.store(prompt, list(prompt))  # computed again: queued as any new block
    assert cold.puts == chain_keys(pc.namespace.digest, prompt, BS)


def test_the_keeper_defers_a_bounded_number_of_keys() -> None:
    cold = FakeColdSource()
    cold.room = 0  # a writer that never drains
    pc = make(BS, cold=cold, deferred_limit=4)
    prompt = seq(6 * BS)
    pc.store(prompt, list(prompt))
    assert pc.stats().deferred_dropped == 2
    cold.room = None
    assert pc.write_deferred() == 4  # the newest four
    assert cold.puts == chain_keys(pc.namespace.digest, prompt, BS)[2:]
