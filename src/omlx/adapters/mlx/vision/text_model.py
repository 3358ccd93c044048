"""A vision-language model seen by the engine as an mlx-lm text model.

The engine (mlx-lm's ``BatchGenerator`` and omlx's batch classes) calls
``model(token_ids, cache=...)``, batched, chunked, from any position a restore left it
at. A VLM request's prompt holds its images as *key ids* (``domain/cache/image_keys``):
where a call meets them, this wrapper builds the input embeddings itself, the text
tokens' embeddings with each image's rows written over its key ids' positions, and runs
the language model on them. The ids alone name the rows (``ImageRows``), so nothing per
row, per chunk or per request is needed: a chunk that starts inside an image, a batch
mixing images and text, and a restore that stopped anywhere all work the same.

Calls without key ids (every decode step, text-only prompts) run the language model as
mlx-vlm does. The caches are mlx-lm's own classes (mlx-vlm's have the same interface):
the cache layer of omlx (layouts, block files, batching) knows those.

An M-RoPE model (Qwen2-VL, Qwen2.5-VL) is the one exception to "nothing per row": the
positions of a row's tokens depend on the images before them. The engine hands each
call the ``PositionPlan`` of every row's request (``plans``, made here by
``position_plan`` at admission), and each row's tokens get the positions their plan
gives at the row's cache offset: explicit ``position_ids``, never mlx-vlm's per-model
``_rope_deltas``.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache

from omlx.adapters.mlx.vision.image_rows import ImageRows
from omlx.adapters.mlx.vision.mrope import PositionPlan
from omlx.domain.cache.image_keys import IMAGE_ID_BASE

# The M-RoPE families whose positions ``mrope`` plans as mlx-vlm's ``get_rope_index``
# does for images (others, such as Qwen3-VL's timestamps, are refused at load).
MROPE_FAMILIES = ("qwen2_vl", "qwen2_5_vl")


class VisionTextModel(nn.Module):
    """``vlm.language_model`` behind mlx-lm's text-model interface, images by key id."""

    def __init__(self, vlm: Any, rows: ImageRows, *, mrope: bool = False) -> None:
        super().__init__()
        self.vlm = vlm  # the one child: its parameters count once
        self.rows = rows
        # Whether each call needs its rows' position plans (the engine reads this).
        self.needs_row_plans = mrope
        text_config = getattr(vlm.config, "text_config", None)
        self.model_type = getattr(vlm.config, "model_type", "vlm")
        self.args = text_config
        self.vocab_size = int(getattr(text_config, "vocab_size", 0) or 0)

    @property
    def language_model(self) -> Any:
        return self.vlm.language_model

    @property
    def _decoder(self) -> Any:
        """The module holding ``embed_tokens`` and ``layers`` (Idefics3's language model
        is that module itself; the others wrap it as ``.model``)."""
        lm = self.language_model
        return lm.model if "model" in lm else lm

    @property
    def layers(self) -> list[Any]:
        return self._decoder.layers

    def make_cache(self) -> list[Any]:
        """The language model's cache in mlx-lm's classes (same sizes as mlx-vlm's)."""
        made = (
            self.language_model.make_cache()
            if hasattr(self.language_model, "make_cache")
            else [None] * len(self.layers)
        )
        out: list[Any] = []
        for entry in made:
            name = type(entry).__name__
            if entry is None or name == "KVCache":
                out.append(KVCache())
            elif name == "RotatingKVCache":
                out.append(RotatingKVCache(max_size=entry.max_size, keep=entry.keep))
            else:
                raise TypeError(f"{self.model_type}: its {name} layers are not served by omlx")
        return out

    def position_plan(self, tokens: Any) -> PositionPlan | None:
        """Where a prompt's images sit, for an M-RoPE model (None for the others)."""
        return PositionPlan.of(tokens, self.rows.image_at) if self.needs_row_plans else None

    def __call__(
        self,
        inputs: mx.array,
        cache: Any = None,
        plans: list[PositionPlan | None] | None = None,
        **_: Any,
    ) -> mx.array:
        """Logits of ``inputs`` (key ids included); ``plans``: each row's position plan
        (M-RoPE only; None, or a row's None, is a prompt without images)."""
        extra = (
            {"position_ids": self._positions(inputs, cache, plans)} if self.needs_row_plans else {}
        )
        if inputs.size == 0 or int(mx.max(inputs).item()) < IMAGE_ID_BASE:
            return self.language_model(inputs, cache=cache, **extra).logits
        ids = np.array(inputs)
        images = ids >= IMAGE_ID_BASE
        text_ids = mx.array(np.where(images, 0, ids))
        embeds = self._decoder.embed_tokens(text_ids)
        rows, positions = self._image_rows(ids, images)
        embeds[mx.array(positions[0]), mx.array(positions[1])] = rows.astype(embeds.dtype)
        return self.language_model(text_ids, inputs_embeds=embeds, cache=cache, **extra).logits

    def _positions(
        self, inputs: mx.array, cache: Any, plans: list[PositionPlan | None] | None
    ) -> mx.array:
        """(3, rows, length) M-RoPE positions: each row's plan at its cache offset."""
        rows, length = inputs.shape
        offset = cache[0].offset if cache else 0
        starts = np.array(offset).reshape(-1).tolist() if isinstance(offset, mx.array) else None
        starts = starts or [int(offset)] * rows
        plans = plans or [None] * rows
        out = np.empty((3, rows, length), dtype=np.int32)
        for row, (start, plan) in enumerate(zip(starts, plans, strict=True)):
            if plan is not None:
                out[:, row] = plan.positions(start, length)
                continue
            if length and int(mx.max(inputs[row]).item()) >= IMAGE_ID_BASE:
                raise ValueError(f"{self.model_type}: a row with images came without their plan")
            out[:, row] = np.arange(start, start + length)  # no image before: plain positions
        return mx.array(out)

    def _image_rows(
        self, ids: np.ndarray, images: np.ndarray
    ) -> tuple[mx.array, tuple[np.ndarray, np.ndarray]]:
        """The rows for every key id in ``ids`` (in row-major order) and their positions."""
        where = np.nonzero(images)
        wanted = ids[where]
        parts = []
        i = 0
        while i < len(wanted):  # one run of one image's ids at a time
            rows, index = self.rows.rows_at(int(wanted[i]))
            first = int(wanted[i]) - index
            j = i + 1
            while j < len(wanted) and first <= wanted[j] < first + rows.shape[0]:
                j += 1
            parts.append(rows[mx.array(wanted[i:j] - first)])
            i = j
        return mx.concatenate(parts, axis=0), where
