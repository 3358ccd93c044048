"""The MLX codec: cut mlx-lm caches into stored objects and join objects back into caches.

One codec per model, over its ``ModelLayout`` (``layout``): a small registry by
cache class decides what each leaf contributes. ``kv`` leaves give a block's KV,
``window`` leaves (sliding attention) a block's window KV, ``state`` leaves (SSM) a
snapshot; ``assemble`` rebuilds ``KVCache``, ``RotatingKVCache`` (offset and index set so
it continues as if it had seen every position), ``ArraysCache`` and ``CacheList`` entries.

Runs on the engine thread only: ``split`` materializes its slices there, and ``encode``
turns them into bytes (``block_bytes``) so the writer thread never touches MLX. An object
read from disk stays in the file's bytes (``decode`` makes zero-copy numpy views), so a
restore copies the KV once into MLX: ``assemble`` gathers each layer's blocks on the host
(``join``; several times faster here than ``mx.concatenate``) and hands MLX one array.

With a ``KVQuant`` setting in ``store`` mode, ``split`` quantizes each block as it cuts
it (``quantized``): the hot tier and the files keep the codes, ``assemble`` dequantizes.
In ``exact`` mode the running cache holds the codes already (``exact``):
``split`` slices them, ``assemble`` puts them back into ``ExactKVCache``s as they are, and
layers that run in full precision (sliding windows; a head_dim the group size does not
divide) are stored in full precision, so that a hit equals a miss.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

from omlx.adapters.blockfiles.expected import BlockSpec, file_problem, layout_problem
from omlx.adapters.blockfiles.format import unpack_block
from omlx.adapters.mlx.cache import block_bytes
from omlx.adapters.mlx.cache.blocks import (
    Blocks,
    KVBlock,
    StateSnapshot,
    groups_of,
    one_or_groups,
)
from omlx.adapters.mlx.cache.join import from_host, join_leaves
from omlx.adapters.mlx.cache.layout import ModelLayout, flat_leaves, plain_layout
from omlx.adapters.mlx.cache.quantized import (
    QuantizedKVBlock,
    exact_block,
    quantizable,
    quantized_block,
)
from omlx.adapters.mlx.cache.restored_cache import with_room
from omlx.adapters.mlx.mlx_lm_private import rows
from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import ExactKVCache
from omlx.adapters.mlx.mlx_lm_private.rows import RowView
from omlx.domain.cache.blocks import BlockMeta, DecodedBlock
from omlx.domain.cache.keys import KV, STATE, WINDOW
from omlx.domain.cache.kv_quant import KVQuant


class MLXKVCodec:
    """Implements the domain's ``KVCodec`` port for one model's layout."""

    def __init__(
        self,
        layout: ModelLayout | None = None,
        kv_quant: KVQuant | None = None,
        expected: BlockSpec | None = None,
    ) -> None:
        self._layout = layout  # None: learned from the first cache (plain KV)
        self.kv_quant = kv_quant  # None: blocks in the model's KV dtype
        # What this model's object files hold (``expected_blocks``), set by the wiring
        # once the model is probed; None only for a codec that cuts and joins alone.
        self.expected = expected
        # A read decodes a file, then checks it, on one thread: the check reuses that
        # parse (a second one cost as much as the checks themselves, ~0.2 ms a block).
        self._last_parse = threading.local()

    # ---- cutting (engine thread) --------------------------------------------------

    def split(self, cache: Any, start: int, stop: int) -> KVBlock | Blocks:
        """KV of the full-attention leaves for positions ``[start, stop)``."""
        return self._cut(cache, KV, start, stop)

    def split_window(self, cache: Any, start: int, stop: int) -> KVBlock | Blocks:
        """KV of the sliding-window leaves for positions ``[start, stop)``."""
        return self._cut(cache, WINDOW, start, stop)

    def snapshot(self, cache: Any) -> StateSnapshot:
        layers = self._leaf_layers(cache)
        leaves = tuple(self.layout(cache).of(STATE))
        arrays = tuple(tuple(rows.state_arrays(*layers[i])) for i in leaves)
        mx.eval([a for slots in arrays for a in slots if a is not None])
        nbytes = sum(a.nbytes for slots in arrays for a in slots if a is not None)
        return StateSnapshot(leaves, arrays, nbytes)

    def _cut(self, cache: Any, kind: str, start: int, stop: int) -> KVBlock | Blocks:
        layers = self._leaf_layers(cache)
        leaves = self.layout(cache).of(kind)
        if not leaves:  # no leaves of this kind (an all-SSM model's KV): tokens only
            return Blocks((), stop - start)
        slices = [rows.kv_slice(*layers[i], start, stop) for i in leaves]
        if isinstance(slices[0][0], tuple):  # exact mode: the running cache's own codes
            kv_dtype = layers[leaves[0]][0].kv_dtype
            return self._cut_codes(leaves, slices, stop - start, kv_dtype)
        groups = []
        for members in _shape_groups(leaves, slices):
            keys = mx.stack([slices[m][0] for m in members])
            values = mx.stack([slices[m][1] for m in members])
            groups.append((tuple(leaves[m] for m in members), keys, values))
        quant = self.kv_quant
        # Exact mode stores what ran in full precision as it is: a hit must equal a miss.
        store = quant is not None and not quant.exact
        if store and all(quantizable(k.shape[-1], quant) for _, k, _ in groups):
            blocks: tuple[Any, ...] = tuple(quantized_block(k, v, quant, lv) for lv, k, v in groups)
            mx.eval([(*b.keys, *b.values) for b in blocks])
        else:  # off, or a head_dim the group size does not divide: the KV dtype as it is
            mx.eval([(k, v) for _, k, v in groups])
            blocks = tuple(KVBlock(k, v, k.nbytes + v.nbytes, k.dtype, lv) for lv, k, v in groups)
        return one_or_groups(blocks, stop - start)

    def _cut_codes(
        self, leaves: list[int], slices: list[tuple[Any, Any]], positions: int, kv_dtype: Any
    ) -> KVBlock | Blocks:
        """Blocks of exact mode's quantized layers: their codes, scales and biases stacked."""
        if self.kv_quant is None or not self.kv_quant.exact:
            raise ValueError("a quantized running cache needs an exact-mode kv_quant codec")
        groups: dict[tuple, list[int]] = {}
        for m, (k, v) in enumerate(slices):
            groups.setdefault(tuple(c.shape for c in (*k, *v)), []).append(m)
        blocks = []
        for members in groups.values():
            keys = tuple(mx.stack([slices[m][0][c] for m in members]) for c in range(3))
            values = tuple(mx.stack([slices[m][1][c] for m in members]) for c in range(3))
            lv = tuple(leaves[m] for m in members)
            blocks.append(exact_block(keys, values, self.kv_quant, lv, kv_dtype))
        mx.eval([(*b.keys, *b.values) for b in blocks])
        return one_or_groups(tuple(blocks), positions)

    def layout(self, cache: Any = None) -> ModelLayout:
        if self._layout is None:
            n = len(cache.layers) if isinstance(cache, RowView) else len(cache)
            self._layout = plain_layout(n)
        return self._layout

    def _leaf_layers(self, cache: Any) -> list[tuple[Any, int | None]]:
        """(layer cache, batch row or None) of every leaf, in leaf order."""
        layout = self.layout(cache)
        entries, row = (cache.layers, cache.row) if isinstance(cache, RowView) else (cache, None)
        out = []
        for leaf in layout.leaves:
            layer = entries[leaf.path[0]]
            for j in leaf.path[1:]:
                layer = layer.caches[j]
            out.append((layer, row))
        return out

    # ---- joining ------------------------------------------------------------------

    def assemble(
        self,
        payloads: Sequence[Any],
        windows: Sequence[Any] = (),
        state: Any = None,
        room: int = 0,
    ) -> list[Any]:
        layout = self.layout()
        self._check_fit(payloads, windows, state)
        position = sum(p.positions for p in payloads)
        built: dict[int, Any] = {}
        # Plain KV leaves get ``room`` positions past the restored ones and a growth step
        # more for the first generated tokens, so the prefill that follows writes in place
        # instead of growing (copying) the cache (``restored_cache``). Exact mode's leaves
        # go back as the codes they were cut as (they grow as mlx-lm's quantized cache does).
        exact = self.kv_quant is not None and self.kv_quant.exact
        first = groups_of(payloads[0]) if payloads else ()
        kv_dtypes = {leaf: g.dtype for g in first for leaf in g.leaves or range(g.layer_count)}
        spare = room + KVCache.step if room else 0
        for leaf_index, keys, values in join_leaves([groups_of(p) for p in payloads], exact, spare):
            if isinstance(keys, tuple):  # exact mode: the codes go back as they were cut
                quant, dtype = self.kv_quant, kv_dtypes[leaf_index]
                built[leaf_index] = ExactKVCache.of(
                    keys, values, quant.group_size, quant.bits, dtype
                )
                continue
            built[leaf_index] = with_room(keys, values, position)
        window_rows = join_leaves([groups_of(w) for w in windows]) if windows else []
        for leaf_index, keys, values in window_rows:
            size = layout.leaves[leaf_index].window
            keep = min(position, size, keys.shape[2])
            # The last ``keep`` positions in time order, the write index at their end and
            # the offset at the restore point: it goes on as if it had seen every position.
            c = RotatingKVCache(max_size=size, keep=0)
            window_keys = keys[..., keys.shape[2] - keep :, :]
            window_values = values[..., values.shape[2] - keep :, :]
            c.state = (window_keys, window_values, position, 0, size, keep)
            built[leaf_index] = c
        if state is not None:
            for leaf_index, slots in zip(state.leaves, state.arrays, strict=True):
                c = ArraysCache(len(slots))
                c.state = ([None if a is None else _to_mlx(a) for a in slots], None, None)
                built[leaf_index] = c
        missing = [i for i in range(len(layout.leaves)) if i not in built]
        if missing:
            raise ValueError(f"leaves {missing} have nothing to restore from")
        cache = [_rebuild(entry, built) for entry in layout.shape]
        mx.eval([c.state for c in flat_leaves(cache)])
        return cache

    def truncate(self, payload: Any, n: int) -> Any:
        """The block's first ``n`` positions: a lazy slice (or view), copied by ``assemble``."""
        total = payload.positions
        if not 0 < n <= total:
            raise ValueError(f"cannot keep {n} of a block's {total} positions")
        if n == total:
            return payload
        groups = tuple(
            g.first(n)
            if isinstance(g, QuantizedKVBlock)
            else KVBlock(
                g.keys[..., :n, :], g.values[..., :n, :], g.nbytes * n // total, g.dtype, g.leaves
            )
            for g in groups_of(payload)
        )
        return one_or_groups(groups, n)

    def nbytes(self, payload: Any) -> int:
        return payload.nbytes

    def _check_fit(self, payloads: Sequence[Any], windows: Sequence[Any], state: Any) -> None:
        """Raise ``ValueError`` naming the first object whose tensors this model does not
        compute: joined into a batch, it would fail the step of every request in it."""
        if self.expected is None:
            return
        objects = [(KV, p) for p in payloads] + [(WINDOW, w) for w in windows]
        objects += [(STATE, state)] if state is not None else []
        for i, (kind, payload) in enumerate(objects):
            positions = 0 if kind == STATE else payload.positions  # state: no token axis
            shapes = block_bytes.tensor_shapes(payload)
            problem = layout_problem(self.expected, kind, shapes, positions)
            if problem is not None:
                raise ValueError(
                    f"the restored {kind} object {i} does not fit the model: {problem}"
                )

    def check(self, data: bytes, meta: BlockMeta, *, values: bool = True) -> str | None:
        """Why the object file ``data`` is not one this model computes, or None (``BlockSpec``:
        layers, shapes, dtypes, token count and ids, finite values)."""
        last = getattr(self._last_parse, "parts", None)
        self._last_parse.parts = None
        if self.expected is None:
            return None  # a codec that only cuts and joins: the wiring gives the server's one
        parsed = last[1] if last is not None and last[0] is data else None
        return file_problem(self.expected, data, values=values, parsed=parsed)

    # ---- bytes (engine thread encodes, the request path decodes) --------------------

    def encode(self, payload: Any, tokens: Sequence[int], meta: BlockMeta) -> bytes:
        return block_bytes.encode(payload, tokens, meta, len(self.layout().leaves))

    def decode(self, data: bytes) -> DecodedBlock:
        """Parse an object file; its arrays stay in ``data`` (zero-copy views) until ``assemble``."""
        try:
            parts = unpack_block(data)
        except ValueError as exc:
            raise ValueError(f"malformed block file: {exc}") from exc
        self._last_parse.parts = (data, parts)
        return block_bytes.decode_parts(data, parts)


# ---- helpers ---------------------------------------------------------------------------


def _shape_groups(leaves: list[int], slices: list[tuple[mx.array, mx.array]]) -> list[list[int]]:
    """Member indices of ``slices`` grouped by (keys shape, values shape, dtype), in order."""
    groups: dict[tuple, list[int]] = {}
    for m, (k, v) in enumerate(slices):
        groups.setdefault((k.shape, v.shape, k.dtype), []).append(m)
    return list(groups.values())


def _rebuild(entry: Any, built: dict[int, Any]) -> Any:
    if isinstance(entry, tuple):
        return CacheList(*(_rebuild(e, built) for e in entry))
    return built[entry]


def _to_mlx(array: Any) -> mx.array:
    if isinstance(array, tuple):
        return from_host(array[0], array[1])
    return array
