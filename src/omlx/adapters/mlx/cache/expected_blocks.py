"""A model's ``BlockSpec``: what the engine writes, read off the files it writes for one token.

One token goes through a fresh cache of the class the engine runs (exact mode's codes
included); the codec cuts and encodes it as it would a block, a window object and a
state snapshot, and the files' tensors are the spec. So the spec follows the codec:
a change in what is stored changes what is expected, with no second description to
keep in step. The vocabulary size is the width of the model's logits.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from omlx.adapters.blockfiles.expected import BlockSpec
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.exact import exact_fits, exact_prompt_cache
from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.keys import KV, STATE, WINDOW, block_key

_PROBE_TOKEN = 0


def expected_blocks(model: Any, codec: MLXKVCodec, block_size: int) -> BlockSpec:
    """The spec of ``model``'s object files as ``codec`` writes them (loading thread)."""
    quant = codec.kv_quant
    # As the engine: exact mode runs codes only where every head_dim fits the group size.
    if quant is not None and quant.exact and exact_fits(model, quant.group_size):
        cache = exact_prompt_cache(model, quant.group_size, quant.bits)
    else:
        cache = make_prompt_cache(model)
    logits = model(mx.array([[_PROBE_TOKEN]]), cache=cache)
    mx.eval(logits)
    layout = codec.layout(cache)
    tokens = [_PROBE_TOKEN]
    root = "00" * 32

    def file(kind: str, payload: Any) -> bytes:
        meta = BlockMeta(block_key(root, tokens), root, "11" * 32, 1, kind)
        return bytes(codec.encode(payload, tokens, meta))

    files = {KV: file(KV, codec.split(cache, 0, 1))}
    if layout.of(WINDOW):
        files[WINDOW] = file(WINDOW, codec.split_window(cache, 0, 1))
    if layout.of(STATE):
        files[STATE] = file(STATE, codec.snapshot(cache))
    takes_images = getattr(model, "rows", None) is not None  # vision.text_model's
    return BlockSpec.from_files(block_size, int(logits.shape[-1]), files, takes_images)
