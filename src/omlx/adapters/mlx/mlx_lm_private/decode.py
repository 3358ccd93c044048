"""A decode batch's private state: in-order steps, and the fields a speculative step keeps.

``GenerationBatch`` keeps each row's pending token (sampled, not yet fed:
``_next_tokens``, ``_next_logprobs``), the token it handed out last (``_current_tokens``,
``_current_logprobs``), its processors' context (``_token_context``, a ``TokenBuffer``
whose fill is ``_size``), its count of handed-out tokens (``_num_tokens``) and its stop
matcher (``_matchers``); ``_step`` runs one forward pass. ``batch.speculative`` runs
several tokens per row through one pass and keeps these fields through the functions here.
A lone finishing row's cache leaves the batch uncopied (``HandOverLoneRow``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import BatchKVCache, KVCache, TokenBuffer


class HandOverLoneRow:
    """Mixed into a ``GenerationBatch``: a lone row's cache is handed over, not copied.

    mlx-lm's ``extract_cache`` copies a finishing row's positions out of the batch's
    arrays (``BatchKVCache.extract``), and the batch drops them right after: for an 8B
    model's 8k-token turn a 1.6 GB copy into fresh memory before a one-token reply is
    sent (4 s of page faults on the bench VM's first turn after a start). A lone row's
    arrays are its cache already; handed over with their room past the row's end, the
    next turn that continues it (``FinishedCaches``) writes its tokens in place too.
    """

    def extract_cache(self, idx: int) -> list[Any]:
        handed = lone_row_caches(self)
        return handed if handed is not None else super().extract_cache(idx)  # type: ignore[misc]


def lone_row_caches(batch: GenerationBatch) -> list[KVCache] | None:
    """A one-row batch's caches: ``KVCache``s over its arrays as they are, room past
    ``offset`` included; None unless it is one unpadded row of ``BatchKVCache`` layers.

    The arrays are shared until the batch drops the row (MLX copies a shared array it
    writes to: sharing is always safe, only a copy's cost is saved)."""
    layers = batch.prompt_cache
    if len(batch.uids) != 1 or not layers:
        return None
    if not all(type(c) is BatchKVCache and c.keys is not None for c in layers):
        return None
    padding = mx.concatenate([c.left_padding for c in layers])
    if padding.max().item() != 0:
        return None
    return [_over(c.keys, c.values, c._idx) for c in layers]


def _over(keys: mx.array, values: mx.array, offset: int) -> KVCache:
    cache = KVCache()
    cache.keys, cache.values, cache.offset = keys, values, offset
    return cache


class HandingOverGeneration(HandOverLoneRow, GenerationBatch):
    """mlx-lm's decode steps (pipelined: Metal, CUDA); a lone finishing row uncopied."""


class InOrderGeneration(HandOverLoneRow, GenerationBatch):
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


# ---- what a speculative step reads and keeps ------------------------------------------


def pending_tokens(batch: GenerationBatch) -> mx.array:
    """Each row's next token: sampled by the last step, not yet fed nor handed out."""
    return batch._next_tokens


def handed_out(batch: GenerationBatch, row: int) -> int:
    """Tokens the row has handed out so far (what its max_tokens counts)."""
    return batch._num_tokens[row]


def replace_pending(
    batch: GenerationBatch, tokens: mx.array, logprobs: list[mx.array]
) -> list[mx.array]:
    """A step's outcome, as ``_step`` leaves it: the pending tokens become the current
    ones and ``tokens`` (with ``logprobs``) pending. Returns the log-probabilities of the
    tokens that were pending."""
    previous = batch._next_logprobs
    batch._current_tokens = batch._next_tokens
    batch._current_logprobs = previous
    batch._next_tokens = tokens
    batch._next_logprobs = logprobs
    return previous


def hand_out(batch: GenerationBatch, row: int, token: int) -> str | None:
    """Count a token the row hands out, as ``GenerationBatch.next`` does: "length" at its
    max_tokens, "stop" at a stop sequence, else None."""
    batch._num_tokens[row] += 1
    reason = "length" if batch._num_tokens[row] >= batch.max_tokens[row] else None
    if batch._matchers[row].advance(token):
        reason = "stop"
    return reason


def token_context(batch: GenerationBatch, row: int) -> TokenBuffer:
    """The tokens the row's logits processors are given: its prompt and output so far."""
    return batch._token_context[row]


def context_size(batch: GenerationBatch, row: int) -> int:
    """Tokens the row's processor context holds."""
    return batch._token_context[row]._size


def truncate_context(batch: GenerationBatch, row: int, size: int) -> None:
    """Forget the tokens of the row's processor context past ``size`` (refused drafts)."""
    buffer = batch._token_context[row]
    buffer._size = min(buffer._size, size)
