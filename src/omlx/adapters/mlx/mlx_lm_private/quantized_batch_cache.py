"""Exact mode's running KV cache: mlx-lm's batch cache holding codes instead of values.

``BatchQuantizedKVCache`` is mlx-lm's ``BatchKVCache`` (left padding, per-row offsets,
step-grown buffers) whose keys and values are each the triple ``mx.quantize`` returns
(uint32 codes, scales, biases), as in mlx-lm's single-sequence ``QuantizedKVCache``; its
``bits`` and ``group_size`` send mlx-lm's attention down the quantized path. Its rows
leave as ``ExactKVCache`` (a ``QuantizedKVCache`` that can join a batch again).

Blocks are sliced out of these codes and put back as codes, never requantized:
``quantize ∘ dequantize`` is not idempotent in mlx (39% of values move on a second round
trip at 8-bit/g64), so only the codes themselves make a hit equal a miss. For float32 KV
the scales and biases are held as float16, as blocks store them (``cache.quantized``): a
block is then a plain slice, and the running cache is as small as a block (8-bit/g64:
0.266x float32, not 0.281x). mlx's quantized matmul widens them to the queries' float32
itself; measured here, decode steps take the same time either way (docs/benchmarks.md).
Each cache remembers ``kv_dtype``, the dtype of the KV it quantized (blocks record it).

It lives with mlx-lm's private state because it is one: a subclass of the private
``_BaseCache`` that mirrors ``BatchKVCache``'s write index ``_idx``, called by the batcher
through the interface its batch caches share (``prepare``, ``finalize``, ``filter``,
``extend``, ``extract``, ``merge``). A batch quantized KV cache in mlx-lm would delete it.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache, _BaseCache, dynamic_roll

Triple = tuple[mx.array, mx.array, mx.array]


def scale_dtype(kv_dtype: mx.Dtype) -> mx.Dtype:
    """What scales and biases are held in: float16 for float32 KV, else the KV's dtype."""
    return mx.float16 if kv_dtype == mx.float32 else kv_dtype


def quantize_exact(x: mx.array, group_size: int, bits: int) -> Triple:
    """``x`` as codes, scales and biases, the latter in ``scale_dtype``."""
    codes, scales, biases = mx.quantize(x, group_size=group_size, bits=bits)
    held = scale_dtype(x.dtype)
    return codes, scales.astype(held), biases.astype(held)


def _zeros_like_quantized(x: mx.array, positions: int, group_size: int, bits: int) -> Triple:
    """Empty buffers for ``positions`` positions of a side shaped like ``x`` (B, H, _, D)."""
    batch, heads, _, dim = x.shape
    shape = (batch, heads, positions)
    return (
        mx.zeros((*shape, dim * bits // 32), mx.uint32),
        mx.zeros((*shape, dim // group_size), scale_dtype(x.dtype)),
        mx.zeros((*shape, dim // group_size), scale_dtype(x.dtype)),
    )


def _get_dtype(cache: Any) -> mx.Dtype | None:
    """A cache's ``kv_dtype``: the dtype of the KV it quantized (None: nothing yet)."""
    return None if cache._kv_dtype is None else getattr(mx, cache._kv_dtype)


def _set_dtype(cache: Any, dtype: mx.Dtype | None) -> None:
    # Held by name: mlx-lm deep-copies batch caches (``PromptProcessingBatch.split``), and
    # an ``mx.Dtype`` cannot be copied.
    cache._kv_dtype = None if dtype is None else str(dtype).removeprefix("mlx.core.")


def _map(fn: Any, side: Triple) -> Triple:
    return tuple(fn(c) for c in side)  # type: ignore[return-value]


def _empty_rows(template: Triple, rows: int, positions: int = 0) -> Triple:
    """Zeroed components for ``rows`` rows of ``positions``, shaped like ``template``'s."""
    return _map(lambda t: mx.zeros((rows, t.shape[1], positions, t.shape[3]), t.dtype), template)


def _cat(a: Triple, b: Triple, axis: int) -> Triple:
    """Two sides joined component by component."""
    return tuple(mx.concatenate([x, y], axis=axis) for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def _first(side: Triple, n: int) -> Triple:
    return _map(lambda c: c[..., :n, :], side)


def _write(cache: Any, keys: mx.array, values: mx.array, prev: int) -> None:
    """``keys`` and ``values`` quantized into ``cache``'s sides from position ``prev`` on
    (``update_and_fetch`` of either class, before it counts them); its ``kv_dtype`` set."""
    if cache.keys is None or prev + keys.shape[2] > cache.keys[0].shape[2]:
        _grow(cache, keys, values, prev)
    cache.kv_dtype = keys.dtype
    stop = prev + keys.shape[2]
    for held, new in ((cache.keys, keys), (cache.values, values)):
        for c, q in zip(held, quantize_exact(new, cache.group_size, cache.bits), strict=True):
            c[..., prev:stop, :] = q


def _grow(cache: Any, keys: mx.array, values: mx.array, prev: int) -> None:
    """Room in ``cache``'s sides for ``keys``' positions after ``prev``: whole steps more, as
    mlx-lm's caches grow (a buffer cut off a step boundary is first cut to ``prev``)."""
    grown = (cache.step + keys.shape[2] - 1) // cache.step * cache.step
    new_k = _zeros_like_quantized(keys, grown, cache.group_size, cache.bits)
    new_v = _zeros_like_quantized(values, grown, cache.group_size, cache.bits)
    if cache.keys is None:
        cache.keys, cache.values = new_k, new_v
        return
    if prev % cache.step != 0:
        cache.keys, cache.values = _first(cache.keys, prev), _first(cache.values, prev)
    cache.keys = _cat(cache.keys, new_k, axis=2)
    cache.values = _cat(cache.values, new_v, axis=2)


class ExactKVCache(QuantizedKVCache):
    """One sequence's quantized KV (mlx-lm's ``QuantizedKVCache``), made as exact mode makes
    it, and able to join a ``BatchQuantizedKVCache`` (``merge``)."""

    _kv_dtype: str | None = None
    kv_dtype = property(_get_dtype, _set_dtype)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        _write(self, keys, values, self.offset)
        self.offset += keys.shape[2]
        return self.keys_and_values()

    def size(self) -> int:
        return self.offset

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        return BatchQuantizedKVCache.merge(caches)

    @classmethod
    def of(
        cls, keys: Triple, values: Triple, group_size: int, bits: int, kv_dtype: mx.Dtype | None
    ) -> ExactKVCache:
        """A cache holding these (evaluated or lazy) components, one row of ``offset`` positions."""
        cache = cls(group_size=group_size, bits=bits)
        cache.keys, cache.values, cache.offset = tuple(keys), tuple(values), keys[0].shape[2]
        cache.kv_dtype = kv_dtype
        return cache


class BatchQuantizedKVCache(_BaseCache):
    """``BatchKVCache`` over quantized sides; rows are left-padded to a shared write index."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self.group_size = group_size
        self.bits = bits
        self._kv_dtype: str | None = None  # ``kv_dtype``'s name
        self._idx = 0
        self._right_padding: mx.array | None = None

    kv_dtype = property(_get_dtype, _set_dtype)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        _write(self, keys, values, self._idx)
        self.offset = self.offset + keys.shape[2]
        self._idx += keys.shape[2]
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Triple, Triple]:
        return _first(self.keys, self._idx), _first(self.values, self._idx)

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("Left padding can only be added to an empty BatchQuantizedKVCache")
            left_padding = mx.array(left_padding)
            self.left_padding += left_padding
            self.offset = self.offset - left_padding
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self) -> None:
        """A right-padded chunk's rows rolled right, so padding is on the left again."""
        if self._right_padding is not None:
            padding = self._right_padding[:, None]
            self.keys = _map(lambda c: dynamic_roll(c, padding, axis=2), self.keys)
            self.values = _map(lambda c: dynamic_roll(c, padding, axis=2), self.values)
            self.offset = self.offset - self._right_padding
            self.left_padding += self._right_padding
            self._right_padding = None

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = v

    @property
    def meta_state(self) -> tuple[str, str]:
        return str(self.group_size), str(self.bits)

    @meta_state.setter
    def meta_state(self, v: tuple[str, str]) -> None:
        self.group_size, self.bits = map(int, v)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Forget the newest ``n`` positions of every row (a refused draft's)."""
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array:
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    def filter(self, batch_indices: Any) -> None:
        """Keep only the given rows (in place), then drop padding every row has."""
        if self.keys is not None:
            self.keys = _map(lambda c: c[batch_indices], self.keys)
            self.values = _map(lambda c: c[batch_indices], self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.keys is not None:
                self.keys = _map(lambda c: c[..., shift:, :], self.keys)
                self.values = _map(lambda c: c[..., shift:, :], self.values)
            self._idx -= shift
            self.left_padding -= shift

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Append ``other``'s rows (in place), both right-justified to the larger write index."""
        self.kv_dtype = self.kv_dtype or other.kv_dtype
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        template = self if self.keys is not None else other
        max_idx = max(self._idx, other._idx)
        max_size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

        def pad(c: BatchQuantizedKVCache) -> tuple[Triple, Triple, mx.array, mx.array]:
            k, v = c.keys, c.values
            if k is None:
                k = _empty_rows(template.keys, c.offset.shape[0])
                v = _empty_rows(template.values, c.offset.shape[0])
            left = max_idx - c._idx
            right = max_size - k[0].shape[2] - left
            if right < 0:
                k = _map(lambda t: t[..., :right, :], k)
                v = _map(lambda t: t[..., :right, :], v)
                right = 0
            if left or right:
                widths = [(0, 0), (0, 0), (left, right), (0, 0)]
                k = _map(lambda t: mx.pad(t, widths), k)
                v = _map(lambda t: mx.pad(t, widths), v)
            return k, v, c.offset, c.left_padding + left

        (k1, v1, o1, p1), (k2, v2, o2, p2) = pad(self), pad(other)
        self.keys, self.values = _cat(k1, k2, axis=0), _cat(v1, v2, axis=0)
        self.offset = mx.concatenate([o1, o2])
        self.left_padding = mx.concatenate([p1, p2])
        self._idx = max_idx

    def extract(self, idx: int) -> ExactKVCache:
        """Row ``idx`` as a single-sequence cache (a copy of its positions, padding dropped)."""
        mx.eval(self.left_padding)
        padding = self.left_padding.tolist()[idx]
        end = self._idx

        def row(c: mx.array) -> mx.array:
            return mx.contiguous(c[idx : idx + 1, :, padding:end])

        return ExactKVCache.of(
            _map(row, self.keys), _map(row, self.values), self.group_size, self.bits, self.kv_dtype
        )

    @classmethod
    def merge(cls, caches: list[Any]) -> BatchQuantizedKVCache:
        """One batch of single-sequence quantized caches, left-padded to the longest."""
        first = caches[0]
        group_size, bits = first.group_size, first.bits
        if any(c.group_size != group_size or c.bits != bits for c in caches):
            raise ValueError("caches of different quantization cannot share a batch")
        lengths = [c.offset for c in caches]
        longest = max(lengths)
        if longest == 0:
            return cls([0] * len(caches), group_size, bits)
        padding = [longest - n for n in lengths]
        held = next(c for c in caches if c.keys is not None and c.offset > 0)

        keys = _empty_rows(held.keys, len(caches), longest)
        values = _empty_rows(held.values, len(caches), longest)
        for i, (p, c) in enumerate(zip(padding, caches, strict=True)):
            if c.keys is None or c.offset == 0:
                continue
            for dst, src in zip((*keys, *values), (*c.keys, *c.values), strict=True):
                dst[i : i + 1, :, p : p + c.offset] = src[..., : c.offset, :]
        cache = cls(padding, group_size, bits)
        cache.keys, cache.values = keys, values
        cache.kv_dtype = getattr(held, "kv_dtype", None) or held.keys[1].dtype
        cache.offset += longest
        cache._idx = longest
        return cache

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(c.nbytes for c in (*self.keys, *self.values))
