"""An import's writes over the real writer, files and SQLite index: with a queue far smaller
than the import, every block is either written or reported, never dropped silently."""

from __future__ import annotations

from pathlib import Path

from omlx.adapters.blockfiles.budget import DiskBudget
from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.blockfiles.writer import BlockWriter
from omlx.adapters.sqlindex import open_index
from omlx.domain.cache.cold_tier import ColdTier
from tests.storage_checks import (
    assert_cache_invariants,
    fake_decode,
    make_chain,
    make_namespace,
    no_model_check,
)

BIG = 10**12


def tier_over(tmp_path: Path, *, queue_size: int, max_bytes: int = BIG):
    index = open_index(tmp_path)
    writer = BlockWriter(
        FileBlockStore(tmp_path),
        index,
        DiskBudget(tmp_path, max_bytes=max_bytes, reserve_bytes=0),
        queue_size=queue_size,
    )
    tier = ColdTier(
        make_namespace(), FileBlockStore(tmp_path), index, writer, fake_decode, check=no_model_check
    )
    return tier, writer, index


def test_many_blocks_through_a_queue_of_two_are_all_written_and_counted(tmp_path: Path) -> None:
    tier, writer, index = tier_over(tmp_path, queue_size=2)
    chain = make_chain(tier.namespace, 300)
    try:
        outcomes = tier.write_all(chain)
        assert outcomes == {"written": 300}
        assert len(index.get_blocks([meta.key for meta, _, _ in chain])) == 300
        assert writer.stats().dropped_queue_full == 0
        again = tier.write_all(chain[:10])  # already there: said so
        assert again == {"skipped_existing": 10}
    finally:
        writer.close(timeout=10)
        index.close()
    assert_cache_invariants(tmp_path)


def test_the_engines_write_through_still_drops_on_a_full_queue_and_counts_it(
    tmp_path: Path,
) -> None:
    """The contrast: ``put`` never waits (a request must not stall on the disk)."""
    tier, writer, index = tier_over(tmp_path, queue_size=2)
    chain = make_chain(tier.namespace, 300)
    try:
        for meta, tokens, data in chain:
            tier.put(meta, tokens, data)
        writer.close(timeout=10)
        dropped = writer.stats().dropped_queue_full
        rows = len(index.get_blocks([meta.key for meta, _, _ in chain]))
        assert dropped > 0 and rows + dropped == 300
    finally:
        writer.close(timeout=10)
        index.close()


def test_a_block_larger_than_the_budget_is_reported_as_refused(tmp_path: Path) -> None:
    chain = make_chain(make_namespace(), 3)
    big = make_chain(make_namespace(), 1, kv_bytes=8192, seed=1)
    budget = sum(len(data) for _, _, data in chain) + 100
    tier, writer, index = tier_over(tmp_path, queue_size=4, max_bytes=budget)
    try:
        outcomes = tier.write_all([*chain, *big])
        assert outcomes == {"written": 3, "dropped_no_space": 1}
        assert len(index.get_blocks([meta.key for meta, _, _ in [*chain, *big]])) == 3
    finally:
        writer.close(timeout=10)
        index.close()
    assert_cache_invariants(tmp_path, budget)
