"""The one door to mlx-lm's private state: every private name omlx uses of mlx-lm is here.

Written for mlx-lm 0.32 (``version.WRITTEN_FOR``; a test in
``tests/integration/test_prefill_capture.py`` pins it, and ``tests/unit/test_layering.py``
keeps these names out of every other module). The check is asked once, at an engine's
start: with another mlx-lm, rows are read through the public, copying ``extract_cache``,
the batcher is mlx-lm's own, a restored row is merged by mlx-lm's ``merge``, speculation
is off and exact KV mode runs in full precision (each logged); M-RoPE vision models
are refused at load (``vision.loader``).

- ``rows``: a running request's cache read uncopied (``BatchKVCache._idx``,
  ``RotatingKVCache._temporal_order``), and a lone restored row made a batch cache without
  a copy (it writes ``BatchKVCache._idx``);
- ``batcher``: ``BatchGenerator._prompt_batch``, ``._generation_batch`` and
  ``._currently_processing``, and a hook after ``BatchGenerator._next``; the requests a
  forward pass's rows run, from the batch whose cache list it is given; a split of every
  row of a prompt batch through ``PromptProcessingBatch._copy``, without its gather;
- ``decode``: ``GenerationBatch._step`` (in-order decode) and the per-row fields a
  speculative step keeps (``_next_tokens``, ``_next_logprobs``, ``_current_tokens``,
  ``_current_logprobs``, ``_token_context`` and its ``TokenBuffer._size``,
  ``_num_tokens``, ``_matchers``); a lone finishing row's arrays handed over
  (``BatchKVCache._idx``);
- ``quantized_batch_cache``: exact mode's batch cache, a subclass of ``_BaseCache`` that
  mirrors ``BatchKVCache``'s ``_idx``.

Upstream wish list: each public hook would delete a side door.

1. The logits of the final prefill chunk's last position (with the last token kept in its
   final segment): ``fused_prefill``'s batch swap, progress edit and ``_next`` hook.
2. In-order decode (say ``BatchGenerator(..., pipelined_decode=False)``):
   ``decode.InOrderGeneration``.
3. A multi-token verify step (feed k tokens, get k+1 distributions, keep a prefix): the
   speculative steps' reads and writes of the decode batch's fields.
4. A lone row merged into a batch without a copy: ``rows.lone_row_batch``.
5. A batch quantized KV cache: ``quantized_batch_cache``.
6. A row's cache read without a copy (a view for ``extract_cache``): ``rows.prefill_row``,
   ``rows.decode_row`` and ``kv_slice``'s reads of write indices.
7. Each row's uid passed to the model with a forward pass (or a per-row model argument):
   ``batcher.uids_of``, which M-RoPE models' positions need.
8. Rows moved to decoding, and a finished lone row's cache returned, without a copy
   (``split`` and ``extract_cache`` gather and copy even when every row goes):
   ``SplitRememberingBatch.split`` and ``decode.HandOverLoneRow``.
"""
