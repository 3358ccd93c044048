"""A batcher whose last short prefill chunk also gives the request's first token.

mlx-lm's ``BatchGenerator`` keeps a prompt's last token as a segment of its own and runs
it as a forward pass of its own, after the chunk before it: a follow-up turn's ~40-token
tail costs two passes over the whole context instead of one. Measured on the default
model and 2 CPU cores over a 2,100-token context: a 30-token chunk then the last token
0.84-1.08 s, the 31 tokens in one call 0.70-0.93 s (the second pass alone 0.17-0.21 s).

``FusingBatchGenerator`` runs such a final chunk with its last token and samples the
first token from that call's logits (the same tokens; the chunk's KV differs from the
unfused order's in the last bits, as any other chunk size would). Only where it pays
and the cache's restore points allow it:

- chunks of at most ``FUSE_MAX_TOKENS`` in that step: mlx-lm models return the logits of
  every position, so the head runs over the whole chunk (31 x 49k for a 31-token tail;
  for a 256-token chunk it costs more than the pass it saves);
- plain attention layouts (``fuse=False`` otherwise): a hybrid or sliding-window model's
  restore points are captured at the end of the chunk, before the last token, and the
  state there exists only in the unfused order.

On the CPU it also decodes in order (``_InOrderGeneration``): each token is handed out
before the pass for the next one runs. Everything else is mlx-lm's own flow; both depend
on its private batch fields as ``batch_rows`` does, and are off on another version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import (
    BatchGenerator,
    GenerationBatch,
    PromptProcessingBatch,
    _right_pad_prompts,
)
from mlx_lm.models.cache import TokenBuffer

from omlx.adapters.mlx import batch_rows

FUSE_MAX_TOKENS = 64


@dataclass
class FusedResponse(PromptProcessingBatch.Response):
    """The end of a prompt whose last token ran with its final chunk: the row decodes now."""

    fused: bool = True


class _PromptBatch(PromptProcessingBatch):
    def prompt_with_last_logits(self, tokens: list[list[int]]) -> mx.array:
        """``prompt`` for chunks of at most the step size, keeping each row's last logits."""
        for held, new in zip(self.tokens, tokens, strict=True):
            held += new  # the tokens a row's cache holds, as ``prompt`` keeps them
        lengths = [len(t) for t in tokens]
        width = max(lengths)
        padding = [width - n for n in lengths]
        if max(padding) > 0:
            inputs = _right_pad_prompts(tokens, max_length=width)
            for c in self.prompt_cache:
                c.prepare(lengths=lengths, right_padding=padding)
        else:
            inputs = mx.array(tokens)
        logits = self.model(inputs, cache=self.prompt_cache)
        last = logits[mx.arange(len(tokens)), mx.array(lengths) - 1]
        if max(padding) > 0:
            for c in self.prompt_cache:
                c.finalize()
        mx.eval(last, [c.state for c in self.prompt_cache])
        mx.clear_cache()
        return last


class _PrimedGeneration(GenerationBatch):
    """Rows that start decoding with their first token sampled from given logits.

    ``GenerationBatch`` would run the last prompt token through the model first; these
    rows' caches hold it already (``batch.tokens`` includes it).
    """

    def __init__(self, batch: PromptProcessingBatch, logits: mx.array) -> None:
        super().__init__(
            model=batch.model, uids=[], inputs=mx.array([], dtype=mx.uint32), prompt_cache=[],
            tokens=[], samplers=[], fallback_sampler=batch.fallback_sampler,
            logits_processors=[], stop_sequences=[], max_tokens=[],
        )  # empty, so no forward pass; the rows' fields follow
        self.uids = list(batch.uids)
        self.prompt_cache = batch.prompt_cache
        self.tokens = batch.tokens
        self.samplers = batch.samplers
        self.logits_processors = batch.logits_processors
        self.stop_sequences = batch.stop_sequences
        self.max_tokens = batch.max_tokens
        self._token_context = [TokenBuffer(t) for t in self.tokens]
        self._num_tokens = [0] * len(self.uids)
        self._matchers = [ss.matcher() for ss in self.stop_sequences]
        self._current_tokens = mx.array([t[-1] for t in self.tokens], dtype=mx.uint32)
        self._current_logprobs = []
        self._sample_first(logits)

    def _sample_first(self, logits: mx.array) -> None:
        """The sampling half of ``GenerationBatch._step``, on logits already computed."""
        # Each row's context ends with the last prompt token, as after mlx-lm's first step.
        logits, contexts = _processed(self, logits, lambda e: self._token_context[e].state)
        self._next_tokens, self._next_logprobs = _sample(self, logits)
        mx.eval(self._next_tokens, self._next_logprobs, contexts)


class _InOrderGeneration(GenerationBatch):
    """Decode steps that hand out each token before the next forward pass starts.

    mlx-lm's ``_step`` starts the pass for token k+1 (``mx.async_eval``) and then hands
    out token k, to overlap the GPU with Python. On the CPU backend ``async_eval`` runs
    most of that pass before it returns (measured: 80 ms of a 100 ms step), so every
    token, the first included, reached the client one forward pass late. Here the next
    pass is only built, lazily; evaluating token k+1 in the next step runs it. Same
    tokens, same caches; used on the CPU device only.
    """

    def _step(self) -> tuple[list[int], list[mx.array]]:
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        logits, _ = _processed(
            self, logits, lambda e: self._token_context[e].update_and_fetch(inputs[e : e + 1])
        )
        self._next_tokens, self._next_logprobs = _sample(self, logits)
        mx.eval(inputs, self._current_logprobs)  # token k, computed by the last step's graph
        handed = inputs.tolist()
        for held, token in zip(self.tokens, handed, strict=True):
            held.append(token)
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


def _processed(
    batch: GenerationBatch, logits: mx.array, context_of: Callable[[int], mx.array]
) -> tuple[mx.array, list[mx.array]]:
    """The logits after each row's processors, and the token contexts they were given.

    ``context_of(row)`` is only called for rows with processors (it may extend a buffer).
    """
    if not any(batch.logits_processors):
        return logits, []
    rows, contexts = [], []
    for e in range(len(batch.uids)):
        row = logits[e : e + 1]
        processors = batch.logits_processors[e] or ()
        if processors:
            context = context_of(e)
            contexts.append(context)
            for processor in processors:
                row = processor(context, row)
        rows.append(row)
    return mx.concatenate(rows, axis=0), contexts


def _sample(batch: GenerationBatch, logits: mx.array) -> tuple[mx.array, list[mx.array]]:
    """Each row's next token and log-probabilities, as ``GenerationBatch._step`` draws them."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    samplers = [batch.fallback_sampler if s is None else s for s in batch.samplers or []]
    if not samplers or all(s is samplers[0] for s in samplers):
        sampled = (samplers[0] if samplers else batch.fallback_sampler)(logprobs)
    else:
        sampled = mx.concatenate([s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0)
    return sampled, list(logprobs)


class FusingBatchGenerator(BatchGenerator):
    """``BatchGenerator`` that fuses a short final chunk with the prompt's last token."""

    def __init__(self, model: Any, *, fuse: bool = True, in_order: bool = False, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.fuse = fuse and batch_rows.private_access_supported()
        self._prompt_batch = _PromptBatch.empty(
            self.model, self.sampler, prefill_step_size=self.prefill_step_size
        )
        if in_order and batch_rows.private_access_supported():
            self._generation_batch = _InOrderGeneration.empty(self.model, self.sampler)
        self._split_last: set[int] = set()  # uids whose last token mlx-lm cut off its segment
        self.fused_rows = 0  # rows whose last token ran with their final chunk (tests, stats)

    def insert_segments(self, segments: list[list[list[int]]], **kwargs: Any) -> list[int]:
        uids = super().insert_segments(segments, **kwargs)
        for uid, seq in zip(uids, segments, strict=True):
            given = [s for s in seq if s]
            if given and len(given[-1]) > 1:
                self._split_last.add(uid)
        return uids

    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> Any:
        self._split_last.difference_update(uids)
        return super().remove(uids, return_prompt_caches=return_prompt_caches)

    def _fusable(self, uid: int, segments: list[list[int]]) -> bool:
        return (
            uid in self._split_last
            and len(segments) == 2
            and len(segments[1]) == 1
            and len(segments[0]) + 1 <= min(self.prefill_step_size, FUSE_MAX_TOKENS)
        )

    def _next(self) -> tuple[list[Any], list[Any]]:
        if not self.fuse:
            return super()._next()
        generation_responses: list[Any] = []
        prompt_responses: list[Any] = []
        counters = self._counters

        if len(self._generation_batch) > 0:
            tic = time.perf_counter()
            generation_responses = self._generation_batch.next()
            counters.decode_time += time.perf_counter() - tic
            counters.generation_tokens += len(generation_responses)
            counters.generation_steps += 1
            if counters.generation_steps % 512 == 0:
                mx.clear_cache()
        if len(self._generation_batch) >= self.completion_batch_size:
            return prompt_responses, generation_responses

        room = min(
            self.prefill_batch_size - len(self._prompt_batch),
            self.completion_batch_size - len(self._generation_batch),
            len(self._unprocessed_sequences),
        )
        if room > 0:
            self._prompt_batch.extend(self._make_batch(room))

        # Rows left with only their last token: mlx-lm's way, one pass in ``generate``.
        alone = [
            i for i, (segments, _, _) in enumerate(self._currently_processing)
            if len(segments) == 1 and len(segments[0]) == 1
        ]
        if alone:
            last_inputs = [self._currently_processing[i][0][0] for i in alone]
            progress = [(self._currently_processing[i][2],) * 2 for i in alone]
            leaving = set(alone)
            self._currently_processing = [
                p for i, p in enumerate(self._currently_processing) if i not in leaving
            ]
            started = self._prompt_batch.split(alone).generate(last_inputs)
            for uid, p in zip(started.uids, progress, strict=True):
                prompt_responses.append(PromptProcessingBatch.Response(uid, p, True, True))
                self._split_last.discard(uid)
            self._generation_batch.extend(started)

        # This step's chunk of each row. A row whose final chunk is short takes its last
        # token along, when every chunk of the step is short (the head runs on them all).
        rows = list(zip(self._prompt_batch.uids, self._currently_processing, strict=True))
        chunk_lengths = [min(len(seq[0][0]), self.prefill_step_size) for _, seq in rows]
        fused = [
            i for i, (uid, seq) in enumerate(rows) if self._fusable(uid, seq[0])
        ]
        if fused and max(chunk_lengths) + 1 > FUSE_MAX_TOKENS:
            fused = []
        prompts = []
        for i, (uid, seq) in enumerate(rows):
            segments = seq[0]
            if i in fused:
                chunk = segments[0] + segments[1]
                segments.clear()
                seq[1] += len(chunk)
                response = FusedResponse(uid, (seq[1], seq[2]), True, True)
            else:
                chunk = segments[0][: self.prefill_step_size]
                segments[0] = segments[0][len(chunk) :]
                ended = not segments[0]
                if ended:
                    segments.pop(0)
                seq[1] += len(chunk)
                response = PromptProcessingBatch.Response(uid, (seq[1], seq[2]), ended, False)
            prompts.append(chunk)
            prompt_responses.append(response)

        counters.prompt_tokens += sum(len(p) for p in prompts)
        tic = time.perf_counter()
        if fused:
            logits = self._prompt_batch.prompt_with_last_logits(prompts)
            keep = set(fused)
            self._currently_processing = [
                p for i, p in enumerate(self._currently_processing) if i not in keep
            ]
            moved = self._prompt_batch.split(fused)
            self._generation_batch.extend(_PrimedGeneration(moved, logits[mx.array(fused)]))
            for uid in moved.uids:
                self._split_last.discard(uid)
            self.fused_rows += len(moved.uids)
        else:
            self._prompt_batch.prompt(prompts)
        counters.prompt_time += time.perf_counter() - tic
        return prompt_responses, generation_responses
