"""A VLM request's prompt as key tokens: the processor's ids, each image's run made its own.

The model's processor turns the rendered chat text and the images into token ids, each
image's placeholder expanded to as many placeholder tokens as the image takes. Those runs
become the images' key ids (``domain/cache/image_keys``), and each image is registered
with ``ImageRows`` along with what computes its rows when a prefill first needs them: the
processor and ``get_input_embeddings`` run on that image alone, behind the one-image
placeholder text the chat template writes. The model's own code projects (and scales) the
vision features, so the rows are exactly what a whole-prompt pass would write. For an
M-RoPE model the image's grid is registered too, from the same processor output: what
places its tokens (``mrope``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from omlx.adapters.mlx.vision.image_rows import ImageRows
from omlx.adapters.mlx.vision.mrope import Grid, llm_grid
from omlx.domain.cache.image_keys import image_token_ids
from omlx.domain.images import PromptImage

_SHAPES_KEPT = 4096
_BEFORE, _AFTER = "\x02omlx-before\x02", "\x02omlx-after\x02"


class ImagePromptError(ValueError):
    """The processor's tokens and the images do not agree (a template without image parts)."""


class VisionPrompter:
    """Key tokens for a rendered prompt and its images; the images' rows made on demand."""

    def __init__(
        self,
        vlm: Any,
        processor: Any,
        rows: ImageRows,
        render_one_image: Callable[[list[dict[str, Any]]], str],
        grid_merge: int | None = None,
    ) -> None:
        """``grid_merge``: an M-RoPE model's spatial merge size (its images' grids are
        registered in tokens); None for models whose positions ignore image shapes."""
        self.vlm = vlm
        self.processor = processor
        self.rows = rows
        config = vlm.config
        self.image_token_id = int(
            getattr(config, "image_token_index", None) or config.image_token_id
        )
        self.placeholder = _one_image_text(render_one_image)
        self.grid_merge = grid_merge
        self._shapes: dict[str, tuple[int, Grid | None]] = {}  # digest -> (tokens, grid)

    def key_tokens(
        self,
        text: str,
        images: Sequence[PromptImage],
        *,
        tenant: str | None = None,
        store: bool | None = None,
    ) -> list[int]:
        """The prompt's ids with each image's placeholder tokens replaced by ``tenant``'s
        key ids for it; ``store`` goes with the images' registration (``ImageRows.register``).

        An image's tokens need not be one run (Idefics3 cuts an image into tiles, each a
        run between markers): image ``i`` takes the next ``count_i`` placeholder tokens,
        ``count_i`` being what the processor makes of that image alone.
        """
        pictures = [_picture(image) for image in images]
        ids = self._process(text, pictures)["input_ids"]
        at = [i for i, t in enumerate(ids) if t == self.image_token_id]
        shapes = [
            self._shape(image, picture) for image, picture in zip(images, pictures, strict=True)
        ]
        counts = [count for count, _ in shapes]
        if sum(counts) != len(at):
            raise ImagePromptError(
                f"the prompt holds {len(at)} image tokens, its {len(images)} images take "
                f"{sum(counts)}: the chat template must write one image part per image"
            )
        taken = 0
        for image, picture, (count, grid) in zip(images, pictures, shapes, strict=True):
            for position, key in zip(
                at[taken : taken + count],
                image_token_ids(image.digest, count, tenant),
                strict=True,
            ):
                ids[position] = key
            taken += count
            encode = self._encoder(picture, count, image.part)
            self.rows.register(image.digest, count, encode, grid, tenant=tenant, store=store)
        return ids

    def _shape(self, image: PromptImage, picture: Any) -> tuple[int, Grid | None]:
        """How many placeholder tokens the processor makes of ``image`` alone, and their
        grid for an M-RoPE model (remembered)."""
        shape = self._shapes.get(image.digest)
        if shape is None:
            out = self._process(self.placeholder, [picture])
            count = sum(1 for t in out["input_ids"] if t == self.image_token_id)
            grid = None
            if self.grid_merge is not None:
                grid = llm_grid(np.asarray(out["image_grid_thw"]).reshape(-1), self.grid_merge)
            if len(self._shapes) >= _SHAPES_KEPT:
                self._shapes.pop(next(iter(self._shapes)))
            self._shapes[image.digest] = shape = (count, grid)
        return shape

    def stats(self) -> dict[str, int | bool]:
        return self.rows.stats()

    def digest_at(self, token: int) -> str | None:
        return self.rows.digest_at(token)

    def _process(self, text: str, pictures: list[Any]) -> dict[str, Any]:
        """The processor's output (numpy), ``input_ids`` as one list of ints."""
        out = dict(self.processor(text=[text], images=pictures or None, return_tensors="np"))
        out["input_ids"] = np.asarray(out["input_ids"]).reshape(-1).tolist()
        return out

    def _encoder(self, picture: Any, count: int, part: str) -> Callable[[], mx.array]:
        def encode() -> mx.array:
            inputs = self._process(self.placeholder, [picture])
            ids = inputs.pop("input_ids")
            arrays = {k: mx.array(np.asarray(v)) for k, v in inputs.items() if v is not None}
            pixel_values = arrays.pop("pixel_values")
            mask = arrays.pop("attention_mask", None)
            embedded = self.vlm.get_input_embeddings(
                mx.array([ids]), pixel_values, mask=mask, **arrays
            )
            at = [i for i, t in enumerate(ids) if t == self.image_token_id]
            if len(at) != count:
                raise ImagePromptError(
                    f"{part or 'an image'}: {len(at)} placeholder tokens alone, {count} in the prompt"
                )
            return embedded.inputs_embeds[0][mx.array(at)]

        return encode


def _picture(image: PromptImage) -> Any:
    from PIL import Image

    return Image.frombytes("RGB", (image.width, image.height), image.rgb)


def _one_image_text(render: Callable[[list[dict[str, Any]]], str]) -> str:
    """What the chat template writes for one image part (between two marker texts)."""
    text = render(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": _BEFORE},
                    {"type": "image"},
                    {"type": "text", "text": _AFTER},
                ],
            }
        ]
    )
    if _BEFORE not in text or _AFTER not in text:
        raise ImagePromptError("the chat template does not render content parts")
    between = text.split(_BEFORE, 1)[1].split(_AFTER, 1)[0]
    if not between.strip():
        raise ImagePromptError("the chat template writes nothing for an image part")
    return between.strip()
