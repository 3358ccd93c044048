"""A lone row moves from prefill to decoding, and leaves the batch, without a copy of its cache.

mlx-lm's split gathers the rows it keeps and its ``extract_cache`` copies a finishing
row out: for a long restored prefix each was a copy of the whole cache into fresh memory,
paid by the first turn after a start (an 8B model, 8k tokens: 5-6 s instead of 1 s).
"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.finished_caches import FinishedCaches
from omlx.adapters.mlx.cache.restored_cache import with_room
from omlx.adapters.mlx.mlx_lm_private import version
from omlx.adapters.mlx.mlx_lm_private.batcher import SplitRememberingBatch
from omlx.adapters.mlx.mlx_lm_private.decode import lone_row_caches
from omlx.adapters.mlx.mlx_lm_private.rows import lone_row_batch
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.prefix_cache import PrefixCache
from tests.engine_helpers import generate, greedy

pytestmark = pytest.mark.skipif(not version.allowed(), reason="mlx-lm's private state is off")

HELD, ROOM = 3000, 64


def restored_row() -> list:
    """A restored cache of two layers, ``HELD`` positions and ``ROOM`` free after them."""
    shape = (1, 2, HELD + ROOM, 128)
    return [with_room(mx.random.normal(shape), mx.random.normal(shape), HELD) for _ in range(2)]


def test_a_lone_row_split_off_to_decode_keeps_its_arrays():
    cache = restored_row()
    keys = [c.keys for c in cache]  # held here too: a copy would be new memory
    mx.eval(keys, [c.values for c in cache])
    nbytes = sum(c.nbytes for c in cache)
    batch = SplitRememberingBatch(None, [7], [cache], samplers=[None], logits_processors=[[]])
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    moved = batch.split([0])
    mx.eval([c.state for c in moved.prompt_cache])
    assert mx.get_peak_memory() - before < nbytes // 4
    assert moved.uids == [7] and batch.uids == [] and batch.prompt_cache == []
    assert [c._idx for c in moved.prompt_cache] == [HELD, HELD]
    assert batch.split_off is moved


def test_a_split_of_some_rows_still_gathers_them():
    rows = [restored_row(), restored_row()]
    batch = SplitRememberingBatch(
        None, [1, 2], rows, samplers=[None] * 2, logits_processors=[[]] * 2
    )
    moved = batch.split([1])
    assert moved.uids == [2] and batch.uids == [1]
    assert moved.prompt_cache[0].keys.shape[0] == batch.prompt_cache[0].keys.shape[0] == 1


def test_a_lone_finishing_row_is_handed_over_with_its_room():
    layers = [lone_row_batch(c) for c in restored_row()]
    handed = lone_row_caches(SimpleNamespace(uids=[3], prompt_cache=layers))
    assert handed is not None
    assert all(
        h.keys is b.keys and h.values is b.values for h, b in zip(handed, layers, strict=True)
    )
    assert [h.offset for h in handed] == [HELD, HELD]
    assert all(h.keys.shape[2] == HELD + ROOM for h in handed)  # the room goes along


def test_rows_that_share_a_batch_or_are_padded_are_copied_as_mlx_lm_copies():
    two = [BatchKVCache.merge([a, b]) for a, b in zip(restored_row(), restored_row(), strict=True)]
    assert lone_row_caches(SimpleNamespace(uids=[1, 2], prompt_cache=two)) is None
    padded = [lone_row_batch(c) for c in restored_row()]
    for layer in padded:
        layer.left_padding = mx.array([5])
    assert lone_row_caches(SimpleNamespace(uids=[1], prompt_cache=padded)) is None


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def test_a_finished_requests_kept_cache_is_the_batchs_own_arrays(tiny):
    """Its room past the end shows it was handed over (a copy holds exactly its positions),
    and the next turn continuing it in place gives what a restore from blocks gives."""
    prompt = list(range(3, 203))
    outputs = []
    for keep in (0, 2):
        finished = FinishedCaches(keep)
        cache = PrefixCache(
            namespace=tiny.namespace(16), codec=MLXKVCodec(), hot=HotTier(1 << 30), kept=finished
        )
        engine = MLXEngine(tiny, cache, EngineConfig(prefill_step_size=64))
        engine.start()
        try:
            first = generate(engine, greedy(prompt, 5))
            if keep:
                tokens, kept, _ = finished._kept[-1]  # peeked: taking it would end it
                assert kept[0].keys.shape[2] > kept[0].offset == len(tokens) > len(prompt)
            second = generate(engine, greedy([*prompt, 9, 10, 11], 5))
        finally:
            engine.stop()
        assert second.finished.cached_tokens >= len(prompt) - 16
        assert cache.stats().continued_requests == (1 if keep else 0)
        outputs.append((first.text, second.text))
    assert outputs[0] == outputs[1]
