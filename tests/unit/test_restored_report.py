"""What a request's restore used, as its report reads it (``CacheSession.restored``): the same
lookup, so the report's ``cached`` is what the request restored, and what the tiers held
where the prompt left them: other tokens (changed), nothing (new tokens), or a block kept
once and evicted since."""

from __future__ import annotations

from omlx.domain.cache.keys import chain_keys
from tests.fakes import FakeColdSource
from tests.unit.test_prefix_cache import make, seq, serve

BS = 8


def restored(pc, prompt: list[int]):
    session = pc.begin(prompt)
    session.restore()
    found = session.restored()
    session.close()
    assert found.tokens == session.cached_tokens  # what the report says is what it restored
    return found


def test_a_follow_up_restores_the_previous_prompt_and_nothing_is_held_past_it() -> None:
    pc = make(BS, server_id="here")
    first = seq(20)
    serve(pc, first)
    found = restored(pc, [*first, 100, 101, 102])
    assert (found.tokens, found.matched, found.tier) == (20, 20, "hot")
    assert found.stored_next == () and not found.evicted and found.computed_by == "here"


def test_a_changed_prompt_says_what_the_cache_holds_there_instead() -> None:
    pc = make(BS)
    serve(pc, seq(30))
    found = restored(pc, [*seq(11), 500, 501, *seq(10, 20)])
    assert found.tokens == 11  # to the token, from the block the prompt leaves part-way
    assert found.stored_next[:3] == (11, 12, 13)  # and on down the chain in RAM
    changed_early = restored(pc, [*seq(8), 500, *seq(9, 30)])
    assert (changed_early.tokens, changed_early.stored_next[:2]) == (8, (8, 9))


def test_a_block_kept_on_disk_and_evicted_since_is_told_from_one_never_computed() -> None:
    cold = FakeColdSource()
    pc = make(BS, cold=cold)
    prompt = seq(40)
    serve(pc, prompt)  # every block queued for disk: this process knows it kept them
    keys = chain_keys(pc.namespace.digest, prompt, BS)
    pc.hot.discard(keys[2:])
    for key in keys[2:]:
        cold.blocks.pop(key, None)  # evicted from disk too
    gone = restored(pc, [*prompt, 99])
    assert (gone.tokens, gone.evicted, gone.stored_next) == (16, True, ())
    never = restored(pc, [*seq(16), *seq(24, 1000)])  # other tokens past block 2: never kept
    assert (never.tokens, never.evicted) == (16, False)


def test_disk_blocks_and_a_partial_one_read_from_disk_count_as_ssd() -> None:
    cold = FakeColdSource()
    pc = make(BS, cold=cold)
    prompt = seq(21)  # two whole blocks and a trailing partial one of 5 tokens
    serve(pc, prompt)
    pc.hot.clear()
    found = restored(pc, [*prompt, 77])
    assert (found.tokens, found.ssd_tokens, found.hot_tokens, found.tier) == (21, 21, 0, "ssd")
