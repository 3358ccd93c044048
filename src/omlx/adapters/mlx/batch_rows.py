"""The one place omlx reads mlx-lm's private batch state: a running request's cache, uncopied.

Capturing blocks after every prefill chunk must not copy the request's whole prefix each
time (``BatchGenerator.extract_cache`` does: it is O(prefix) per call, O(prefix²) per
prompt). Written for mlx-lm 0.32 (``tests/integration/test_batch_rows.py`` pins it and
checks both paths against each other): with another version the public, copying
``extract_cache`` is used instead, with a warning.

A *row view* is what the codec cuts blocks from: the batch's per-layer caches and the
request's row in them. ``positions`` maps a row's token positions to buffer indices.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    RotatingKVCache,
)

log = logging.getLogger(__name__)

WRITTEN_FOR = "0.32."
_warned = False


@dataclass(frozen=True, slots=True)
class RowView:
    """One request's row of a batch: ``layers`` are the batch's caches (one per model layer)."""

    layers: list[Any]
    row: int


def private_access_supported() -> bool:
    return mlx_lm.__version__.startswith(WRITTEN_FOR)


def prefill_row(
    generator: Any, uid: int, *, private: bool | None = None
) -> RowView | list[Any] | None:
    """The cache of request ``uid`` while it is being prefilled, or None if it is not.

    Uncopied (a ``RowView``) where this mlx-lm version is the one this was written for;
    otherwise a copy through the public ``extract_cache``.
    """
    if private is None:
        private = private_access_supported()
        _warn_once(private)
    if private:
        batch = generator._prompt_batch
        if uid in batch.uids:
            return RowView(batch.prompt_cache, batch.uids.index(uid))
        return None
    found = generator.extract_cache([uid]).get(uid)
    return None if found is None else found[0]


def decode_row(
    generator: Any, uid: int, *, private: bool | None = None
) -> RowView | list[Any] | None:
    """The cache of request ``uid`` while it decodes (same rules as ``prefill_row``)."""
    if private is None:
        private = private_access_supported()
        _warn_once(private)
    if private:
        batch = generator._generation_batch
        if uid in batch.uids:
            return RowView(batch.prompt_cache, batch.uids.index(uid))
        return None
    found = generator.extract_cache([uid]).get(uid)
    return None if found is None else found[0]


def _warn_once(private: bool) -> None:
    global _warned
    if not private and not _warned:
        _warned = True
        log.warning(
            "mlx-lm %s is not the version omlx reads batch caches of (%sx): blocks are cut "
            "through extract_cache, which copies each request's prefix per prefill chunk",
            mlx_lm.__version__,
            WRITTEN_FOR,
        )


# ---- positions in a layer's buffers ---------------------------------------------------


def kv_slice(layer: Any, row: int | None, start: int, stop: int) -> tuple[mx.array, mx.array]:
    """Keys and values of positions ``[start, stop)`` of one attention layer (lazy slices).

    ``layer`` is a single-sequence ``KVCache`` / ``RotatingKVCache`` (``row`` None) or a
    batch ``BatchKVCache`` / ``BatchRotatingKVCache`` (``row`` its row). Raises
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
    if row is None:
        return keys[..., first:last, :], values[..., first:last, :]
    return keys[row : row + 1, :, first:last, :], values[row : row + 1, :, first:last, :]


def _buffers(layer: Any, row: int | None) -> tuple[mx.array, mx.array, int, int]:
    """(keys, values, buffer index one past the newest position, that position + 1)."""
    if isinstance(layer, KVCache):
        return layer.keys, layer.values, layer.offset, layer.offset
    if isinstance(layer, RotatingKVCache):
        keys, values = layer._temporal_order(layer.keys), layer._temporal_order(layer.values)
        return keys, values, keys.shape[2], layer.offset
    if isinstance(layer, BatchKVCache | BatchRotatingKVCache):
        return layer.keys, layer.values, layer._idx, _row_offset(layer, row)
    raise TypeError(f"{type(layer).__name__} holds no positions")


def _row_offset(layer: Any, row: int | None) -> int:
    mx.eval(layer.offset)
    return int(layer.offset[row].item())


def state_arrays(layer: ArraysCache, row: int | None) -> list[mx.array | None]:
    """An ``ArraysCache``'s arrays (its state after the newest position), of one row."""
    if row is None:
        return list(layer.cache)
    return [None if a is None else a[row : row + 1] for a in layer.cache]


def children(layer: CacheList) -> list[Any]:
    return list(layer.caches)
