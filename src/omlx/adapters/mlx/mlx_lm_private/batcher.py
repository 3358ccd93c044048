"""The batcher's private state that ``batch.fused_prefill`` and the row reads use.

``BatchGenerator`` keeps its two batches (``_prompt_batch``, ``_generation_batch``) and the
prefill progress of each prompt row (``_currently_processing``) private, and runs each step
in ``_next``. omlx puts its own batch classes in (fused final chunks, in-order and
speculative decode steps), takes rows it moved to decoding out of the progress list, runs
a hook after each step, and tells which requests a forward pass's rows run (``uids_of``).
"""

from __future__ import annotations

from typing import Any

from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch


def prompt_batch(generator: Any) -> PromptProcessingBatch:
    """The batch of rows being prefilled (one object for the generator's life)."""
    return generator._prompt_batch


def generation_batch(generator: Any) -> GenerationBatch:
    """The batch of rows decoding (one object for the generator's life)."""
    return generator._generation_batch


def uids_of(generator: Any, cache: list[Any]) -> list[int] | None:
    """The requests (uids, in row order) of the batch whose per-layer caches ``cache`` is:
    the batch being prefilled, the one decoding, or the one just split off to decode (a
    ``SplitRememberingBatch``'s); None for a cache of none of them.
    """
    prompt = generator._prompt_batch
    split_off = getattr(prompt, "split_off", None)
    for batch in (prompt, generator._generation_batch, split_off):
        if batch is not None and batch.prompt_cache is cache:
            return batch.uids
    return None


class SplitRememberingBatch(PromptProcessingBatch):
    """A prompt batch that remembers the batch it split off last.

    mlx-lm moves rows to decoding with ``split(rows).generate(last_tokens)``, and
    ``GenerationBatch.__init__`` runs the rows' first decode pass there, before they join
    the generator's decode batch: that pass's rows are the split-off batch's.
    """

    split_off: PromptProcessingBatch | None = None

    def split(self, indices: list[int]) -> PromptProcessingBatch:
        """mlx-lm's split; when every row leaves, their caches go along uncopied.

        mlx-lm filters the split-off copy to the rows asked for, a gather into fresh
        arrays (``BatchKVCache.filter``) even when that is all of them: a lone 8k-token
        row of an 8B model was a 1.6 GB copy on its way to decoding.
        """
        if sorted(indices) != list(range(len(self.uids))):
            self.split_off = super().split(indices)
            return self.split_off
        moved = self._copy()  # a deep copy of MLX arrays shares their buffers
        self.filter([])  # the batch lets go of them: the moved rows write in place
        self.split_off = moved
        return moved


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


class HookedBatchGenerator(BatchGenerator):
    """``BatchGenerator`` that calls ``after_step`` at the end of each step of its loop.

    It wraps ``_next`` (calls it, does not copy it), so the hook runs on the generator's
    stream, inside ``next``, before the step's responses are returned.
    """

    def _next(self) -> tuple[list[Any], list[Any]]:
        prompt_responses, generation_responses = super()._next()
        self.after_step(prompt_responses)
        return prompt_responses, generation_responses

    def after_step(self, prompt_responses: list[Any]) -> None:
        """What a subclass does after each step; ``prompt_responses`` may be edited in place."""
