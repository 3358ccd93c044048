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
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache

from omlx.adapters.mlx.vision.image_rows import ImageRows
from omlx.domain.cache.image_keys import IMAGE_ID_BASE


class VisionTextModel(nn.Module):
    """``vlm.language_model`` behind mlx-lm's text-model interface, images by key id."""

    def __init__(self, vlm: Any, rows: ImageRows) -> None:
        super().__init__()
        self.vlm = vlm  # the one child: its parameters count once
        self.rows = rows
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

    def __call__(self, inputs: mx.array, cache: Any = None, **_: Any) -> mx.array:
        if inputs.size == 0 or int(mx.max(inputs).item()) < IMAGE_ID_BASE:
            return self.language_model(inputs, cache=cache).logits
        ids = np.array(inputs)
        images = ids >= IMAGE_ID_BASE
        text_ids = mx.array(np.where(images, 0, ids))
        embeds = self._decoder.embed_tokens(text_ids)
        rows, positions = self._image_rows(ids, images)
        embeds[mx.array(positions[0]), mx.array(positions[1])] = rows.astype(embeds.dtype)
        return self.language_model(text_ids, inputs_embeds=embeds, cache=cache).logits

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
