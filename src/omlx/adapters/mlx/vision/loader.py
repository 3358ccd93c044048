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

from omlx.adapters.mlx.models.errors import UnsupportedModelError
from omlx.adapters.mlx.vision.image_rows import ImageRows
from omlx.adapters.mlx.vision.prompts import VisionPrompter
from omlx.adapters.mlx.vision.text_model import VisionTextModel

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
    if hasattr(vlm.language_model, "get_rope_index"):
        # Qwen-VL's multimodal RoPE: positions after an image depend on its grid, and
        # mlx-vlm keeps them as state of the model object, not of a row: not batchable.
        raise UnsupportedModelError(
            f"{path}: {vlm.config.model_type} places image tokens with multimodal RoPE "
            "(M-RoPE), which omlx's batched engine does not serve yet"
        )
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

    prompter = VisionPrompter(vlm, processor, rows, render)
    if "max_position_embeddings" not in config and "max_position_embeddings" in text:
        config = {**config, "max_position_embeddings": text["max_position_embeddings"]}
    return LoadedVision(VisionTextModel(vlm, rows), tokenizer, config, prompter)
