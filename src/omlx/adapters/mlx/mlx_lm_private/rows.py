"""A running request's cache, read uncopied: its row of the batch's caches, and positions in them.

The block cache cuts blocks from a running request's cache after every prefill chunk.
``BatchGenerator.extract_cache`` would copy the whole prefix per call (O(prefix) per chunk,
O(prefix²) per prompt); a *row view* is the batch's per-layer caches and the request's row
in them, and ``kv_slice`` reads positions straight from a layer's buffers (a batch cache's
write index ``_idx``, a rotating window's ``_temporal_order``). Where the engine may not
use mlx-lm's private state, rows are read through the public, copying ``extract_cache``.

A restored prefix joins a batch here too: ``lone_row_batch`` hands a lone row's arrays to
a batch cache as they are, where mlx-lm's ``BatchKVCache.merge`` would copy them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    KVCache,
    RotatingKVCache,
)

from omlx.adapters.mlx.mlx_lm_private.batcher import generation_batch, prompt_batch
from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import (
    BatchQuantizedKVCache,
    ExactKVCache,
)


@dataclass(frozen=True, slots=True)
class RowView:
    """One request's row of a batch: ``layers`` are the batch's caches (one per model layer)."""

    layers: list[Any]
    row: int


def prefill_row(generator: Any, uid: int, private: bool) -> RowView | list[Any] | None:
    """The cache of request ``uid`` while it is being prefilled, or None if it is not.

    Uncopied (a ``RowView``) where the engine may use mlx-lm's private state
    (``private``); otherwise a copy through the public ``extract_cache``.
    """
    if not private:
        return _copied(generator, uid)
    batch = prompt_batch(generator)
    return RowView(batch.prompt_cache, batch.uids.index(uid)) if uid in batch.uids else None


def decode_row(generator: Any, uid: int, private: bool) -> RowView | list[Any] | None:
    """The cache of request ``uid`` while it decodes (same rules as ``prefill_row``)."""
    if not private:
        return _copied(generator, uid)
    batch = generation_batch(generator)
    return RowView(batch.prompt_cache, batch.uids.index(uid)) if uid in batch.uids else None


def _copied(generator: Any, uid: int) -> list[Any] | None:
    found = generator.extract_cache([uid]).get(uid)
    return None if found is None else found[0]


def lone_row_batch(row: KVCache) -> BatchKVCache:
    """A one-row batch cache over ``row``'s arrays as they are (no padding, no copy).

    ``row``'s arrays may hold room past its offset: the batch writes what is prefilled
    next into them in place. mlx-lm's own merge sets the write index so: positions held.
    """
    batch = BatchKVCache([0])
    batch.keys, batch.values = row.keys, row.values
    batch.offset = batch.offset + row.offset
    batch._idx = row.offset
    return batch


def kv_slice(layer: Any, row: int | None, start: int, stop: int) -> tuple[mx.array, mx.array]:
    """Keys and values of positions ``[start, stop)`` of one attention layer (lazy slices).

    ``layer`` is a single-sequence ``KVCache`` / ``RotatingKVCache`` / ``ExactKVCache``
    (``row`` None) or a batch ``BatchKVCache`` / ``BatchRotatingKVCache`` /
    ``BatchQuantizedKVCache`` (``row`` its row); a quantized one's sides are (codes,
    scales, biases) triples, sliced alike. Raises
    ``ValueError`` when those positions are not (or no longer) in the buffer.
    """
    if isinstance(layer, BatchRotatingKVCache) and layer.rotated:
        # Decode wrapped the buffer around: take the row in time order (a window's copy).
        layer, row = layer.extract(row), None
    keys, values, end, offset = _buffers(layer, row)
    first = end - (offset - start)
    last = end - (offset - stop)
    if stop > offset or first < 0 or start < 0 or stop <= start:
        raise ValueError(
            f"positions [{start}, {stop}) are not in this cache (it holds "
            f"[{offset - min(end, offset)}, {offset}))"
        )
    at = (..., slice(first, last), slice(None))
    if row is not None:
        at = (slice(row, row + 1), slice(None), *at[1:])
    return _sliced(keys, at), _sliced(values, at)


def _sliced(side: Any, at: tuple[Any, ...]) -> Any:
    """One side at ``at``: an array, or exact mode's (codes, scales, biases) each alike."""
    return tuple(c[at] for c in side) if isinstance(side, tuple) else side[at]


def _buffers(layer: Any, row: int | None) -> tuple[mx.array, mx.array, int, int]:
    """(keys, values, buffer index one past the newest position, that position + 1)."""
    if isinstance(layer, KVCache):
        return layer.keys, layer.values, layer.offset, layer.offset
    if isinstance(layer, RotatingKVCache):
        keys, values = layer._temporal_order(layer.keys), layer._temporal_order(layer.values)
        return keys, values, keys.shape[2], layer.offset
    if isinstance(layer, BatchKVCache | BatchRotatingKVCache | BatchQuantizedKVCache):
        return layer.keys, layer.values, layer._idx, _row_offset(layer, row)
    if isinstance(layer, ExactKVCache):  # exact mode's extracted row: codes, scales, biases
        return layer.keys, layer.values, layer.offset, layer.offset
    raise TypeError(f"{type(layer).__name__} holds no positions")


def _row_offset(layer: Any, row: int | None) -> int:
    mx.eval(layer.offset)
    return int(layer.offset[row].item())


def state_arrays(layer: ArraysCache, row: int | None) -> list[mx.array | None]:
    """An ``ArraysCache``'s arrays (its state after the newest position), of one row."""
    if row is None:
        return list(layer.cache)
    return [None if a is None else a[row : row + 1] for a in layer.cache]
