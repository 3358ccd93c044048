"""A model's own sampling defaults: its ``generation_config.json``, or for the bundled GGUF
(which carries none) values measured to answer its README example well."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The sampling keys of a Hugging Face generation_config.json that omlx's sampler knows.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

# SmolLM2-135M-Instruct answers "What is the capital of France?" with "The capital of
# France is Paris." greedily (10 of 10 runs); sampled at temperature 1.0 it did in 3 of 8
# runs and at 0.2 / top_p 0.9 (its model card's values) in 8 of 10: its first token is
# "The" at 15% and "L" (a French digression) at 14%. So greedy, as transformers generates
# when a generation_config.json does not ask for sampling (SmolLM2's does not).
BUNDLED_GENERATION_CONFIG: dict[str, Any] = {"temperature": 0.0}


def read_generation_config(folder: Path) -> dict[str, Any]:
    """The sampling defaults of an mlx-lm folder; empty without a generation_config.json.

    ``do_sample: false`` means greedy in transformers whatever the temperature says.
    """
    path = folder / "generation_config.json"
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return {}
    found = {
        k: raw[k]
        for k in SAMPLING_KEYS
        if isinstance(raw.get(k), int | float) and not isinstance(raw.get(k), bool)
    }
    if raw.get("do_sample") is False:
        found["temperature"] = 0.0
    return found
