"""Load a vision-language model folder through mlx-vlm, for the engine and the chat pipeline.

A folder is a VLM when its ``config.json`` has a ``vision_config`` (every family mlx-vlm
serves writes one). mlx-vlm builds the model and its processor; the engine gets the
language model behind ``VisionTextModel``, the chat pipeline a tokenizer (mlx-lm's wrapper
over the processor's, with the processor's chat template where the tokenizer has none)
and a ``VisionPrompter`` that turns a rendered prompt and its images into key tokens.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omlx.adapters.mlx.mlx_lm_private import version
from omlx.adapters.mlx.models.errors import UnsupportedModelError
from omlx.adapters.mlx.vision.image_rows import ImageRows
from omlx.adapters.mlx.vision.prompts import VisionPrompter
from omlx.adapters.mlx.vision.text_model import MROPE_FAMILIES, VisionTextModel

log = logging.getLogger(__name__)

# Files that change how the processor cuts and scales an image: part of the namespace.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
IMAGE_ROWS_BUDGET = 1 << 30  # bytes of image rows kept per model (the vision-feature LRU)


@dataclass(slots=True)
class LoadedVision:
    model: VisionTextModel
    tokenizer: Any  # mlx-lm's TokenizerWrapper
    config: dict[str, Any]
    prompter: VisionPrompter


def is_vision_folder(path: Path) -> bool:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def load_vision(path: Path) -> LoadedVision:
    """The model, tokenizer and prompter of the VLM folder ``path`` (mlx-vlm installed)."""
    try:
        from mlx_vlm.utils import load as mlx_vlm_load
    except ImportError as exc:  # the vision extra is not installed
        raise ImportError(
            f"{path} is a vision-language model; serving it needs the vision extra: "
            "pip install 'omlx[vision]'"
        ) from exc
    from mlx_lm.utils import load_tokenizer

    vlm, processor = mlx_vlm_load(str(path))
    mrope = _multimodal_rope(path, vlm)
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config") or {}
    eos = text.get("eos_token_id", config.get("eos_token_id"))
    tokenizer = load_tokenizer(path, eos_token_ids=eos)
    template = getattr(processor, "chat_template", None)
    if tokenizer.chat_template is None and template:
        tokenizer._tokenizer.chat_template = template
    rows = ImageRows(IMAGE_ROWS_BUDGET)

    def render(messages: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    merge = int(vlm.config.vision_config.spatial_merge_size) if mrope else None
    prompter = VisionPrompter(vlm, processor, rows, render, grid_merge=merge)
    if "max_position_embeddings" not in config and "max_position_embeddings" in text:
        config = {**config, "max_position_embeddings": text["max_position_embeddings"]}
    return LoadedVision(VisionTextModel(vlm, rows, mrope=mrope), tokenizer, config, prompter)


def _multimodal_rope(path: Path, vlm: Any) -> bool:
    """Whether the model places image tokens with multimodal RoPE (M-RoPE), which omlx
    serves for the families ``mrope`` plans; refuses the others, saying why."""
    if not hasattr(vlm.language_model, "get_rope_index"):
        return False
    family = vlm.config.model_type
    if family not in MROPE_FAMILIES:
        raise UnsupportedModelError(
            f"{path}: {family} places image tokens with multimodal RoPE (M-RoPE) in a way "
            f"omlx does not plan yet (it plans {', '.join(MROPE_FAMILIES)})"
        )
    if not version.private_access_supported():
        import mlx_lm

        # A batched call's rows are told apart through the batcher's private batches.
        raise UnsupportedModelError(
            f"{path}: {family}'s M-RoPE positions need mlx-lm {version.WRITTEN_FOR}x "
            f"(this is {mlx_lm.__version__})"
        )
    return True
