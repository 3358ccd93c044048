"""omlx's one contact with mlx-lm's private batch state, behind one version check.

Two users read it:

- the block cache cuts blocks from a running request's cache after every prefill chunk,
  uncopied (``BatchGenerator.extract_cache`` copies the whole prefix per call: O(prefix)
  per chunk, O(prefix²) per prompt). A *row view* is what the codec cuts blocks from: the
  batch's per-layer caches and the request's row in them;
- the batcher (``fused_prefill``) puts its own batch classes in, takes the rows it moved
  to decoding out of the prefill list, and decodes in order (``InOrderGeneration``).

Every private name omlx uses of mlx-lm is here: ``BatchGenerator._prompt_batch``,
``._generation_batch`` and ``._currently_processing``; ``GenerationBatch._step`` and the
fields it keeps (``_current_tokens``, ``_current_logprobs``, ``_next_tokens``,
``_next_logprobs``, ``_token_context``, ``_num_tokens``, ``_matchers``: the speculative
steps of ``speculative.py`` keep them too); ``TokenBuffer._size``; ``BatchKVCache._idx``
and ``RotatingKVCache._temporal_order``; and ``BatchGenerator._next``, which
``FusingBatchGenerator`` wraps (it calls it, it does not copy it).

Written for mlx-lm 0.32 (``test_batch_rows_was_written_for_this_mlx_lm`` in
``tests/integration/test_prefill_capture.py`` pins it, and
``test_uncopied_reads_cut_the_same_blocks_as_extract_cache`` checks both ways of reading
a row against each other). With another version, rows are read through the public,
copying ``extract_cache`` (with a warning) and the batcher is mlx-lm's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx_lm
from mlx_lm.generate import GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import (
    ArraysCache,
    BatchKVCache,
    BatchRotatingKVCache,
    CacheList,
    KVCache,
    RotatingKVCache,
    TokenBuffer,
)

from omlx.adapters.mlx.mlx_lm_private.quantized_batch_cache import (
    BatchQuantizedKVCache,
    ExactKVCache,
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
        batch = prompt_batch(generator)
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
        batch = generation_batch(generator)
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


# ---- the batcher's hooks (fused_prefill) ------------------------------------------


def prompt_batch(generator: Any) -> PromptProcessingBatch:
    """The batch of rows being prefilled (one object for the generator's life)."""
    return generator._prompt_batch


def generation_batch(generator: Any) -> GenerationBatch:
    """The batch of rows decoding (one object for the generator's life)."""
    return generator._generation_batch


def install_batches(
    generator: Any,
    prompt: PromptProcessingBatch | None = None,
    generation: GenerationBatch | None = None,
) -> None:
    """Put empty batches of omlx's own classes in place of a new generator's.

    New rows join these objects (``extend``), so their classes hold for every row. A
    ``BatchGenerator`` argument naming the batch classes would make this public.
    """
    if prompt is not None:
        generator._prompt_batch = prompt
    if generation is not None:
        generator._generation_batch = generation


def leave_prefill(generator: Any, rows: list[int]) -> None:
    """Forget the prefill progress of rows of the prompt batch (by index): they decode now.

    ``BatchGenerator._next`` keeps that list in the prompt batch's row order; a row split
    off the batch must leave it too.
    """
    leaving = set(rows)
    generator._currently_processing = [
        p for i, p in enumerate(generator._currently_processing) if i not in leaving
    ]


class InOrderGeneration(GenerationBatch):
    """Decode steps that hand out each token before the next forward pass runs.

    mlx-lm's ``_step`` starts the pass for token k+1 (``mx.async_eval``) and then hands
    out token k, to overlap the GPU with Python. On the CPU backend ``async_eval`` runs
    most of that pass before it returns (measured: 80 ms of a 100 ms step), so every
    token, the first included, reached the client one forward pass late. This step only
    builds the next pass; evaluating token k+1 in the next step runs it. Same tokens,
    same caches; used on the CPU only.

    It is ``GenerationBatch._step`` without the ``mx.async_eval`` call: a public switch
    for that pipelining (say ``BatchGenerator(..., pipelined_decode=False)``) would
    remove this class.
    """

    def _step(self) -> tuple[list[int], list[mx.array]]:
        inputs = self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        if any(self.logits_processors):
            logits = _processed(self, logits, inputs)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        self._next_tokens = _sampled(self, logprobs)
        self._next_logprobs = list(logprobs)
        mx.eval(inputs, self._current_logprobs)  # token k: runs the pass the last step built
        handed = inputs.tolist()
        for held, token in zip(self.tokens, handed, strict=True):
            held.append(token)  # ``tokens`` is what each row's cache holds
        return handed, self._current_logprobs

    def next(self) -> list[Any]:
        responses = super().next()
        finished = [r.prompt_cache for r in responses if r.prompt_cache is not None]
        if finished:
            # A finished row's cache still holds the graph of the pass after its last
            # token; computed now, as mlx-lm's eager step would have, so no caller keeps a
            # lazy graph (and the weights it references) alive.
            mx.eval([c.state for cache in finished for c in cache])
        return responses


def token_buffer_size(buffer: TokenBuffer) -> int:
    """Tokens a row's processor context holds."""
    return buffer._size


def truncate_token_buffer(buffer: TokenBuffer, size: int) -> None:
    """Forget the tokens of a row's processor context past ``size`` (refused drafts)."""
    buffer._size = min(buffer._size, size)


def _processed(batch: GenerationBatch, logits: mx.array, inputs: mx.array) -> mx.array:
    """The logits after each row's processors, each given its row's tokens so far."""
    rows = []
    for e, processors in enumerate(batch.logits_processors):
        row = logits[e : e + 1]
        if processors:
            context = batch._token_context[e].update_and_fetch(inputs[e : e + 1])
            for processor in processors:
                row = processor(context, row)
        rows.append(row)
    return mx.concatenate(rows, axis=0)


def _sampled(batch: GenerationBatch, logprobs: mx.array) -> mx.array:
    """Each row's next token: one call when the rows share a sampler, else row by row."""
    samplers = [batch.fallback_sampler if s is None else s for s in batch.samplers or []]
    if not samplers or all(s is samplers[0] for s in samplers):
        return (samplers[0] if samplers else batch.fallback_sampler)(logprobs)
    return mx.concatenate([s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0)


# ---- positions in a layer's buffers ---------------------------------------------------


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


def children(layer: CacheList) -> list[Any]:
    return list(layer.caches)
