"""A model folder's own settings: its ``omlx.json``, read once at load, over the server's.

``{"kv_bits": 4, "kv_group_size": 32, "kv_mode": "exact", "speculation": false,
"draft_model": "../draft"}``: each key overrides the server's setting for that model only.
A mistake in the file names the file; a GGUF file (no folder) has none.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omlx.app.settings import Settings
from omlx.domain.cache.kv_quant import KVQuant, model_override, resolve_kv_mode

OPTIONS_FILE = "omlx.json"


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """What a model's ``omlx.json`` declares (``declared``), and where it was read from."""

    source: Path | None = None  # None: the model has no omlx.json
    declared: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> ModelOptions:
        """The options of the model at ``path`` (a folder; a file has none): ValueError names
        the file when it is not JSON."""
        source = Path(path) / OPTIONS_FILE
        if not source.is_file():
            return cls()
        try:
            declared = json.loads(source.read_text())
        except ValueError as exc:  # bad JSON: name the file
            raise ValueError(f"{source}: {exc}") from exc
        return cls(source, declared if isinstance(declared, dict) else {})

    def kv_quant(
        self, default: KVQuant | None, kv_mode: str | None = None, gpu: bool = False
    ) -> KVQuant | None:
        """The model's KV quantization over ``default`` and ``kv_mode`` (``auto`` resolved by
        ``gpu``; None: ``default``'s mode)."""
        declared = self.declared
        try:
            mode = declared.get("kv_mode", kv_mode)
            resolved = None if mode is None else resolve_kv_mode(mode, gpu)
            quant = model_override(declared, default, resolved)
            if quant is not None and mode is not None:  # auto also depends on the bits
                final = resolve_kv_mode(mode, gpu, quant.bits)
                if final != quant.mode:
                    quant = dataclasses.replace(quant, mode=final)
            return quant
        except ValueError as exc:  # a bad kv_bits or kv_mode: name the file that set it
            raise ValueError(f"{self.source}: {exc}" if declared else str(exc)) from exc

    def speculation(self, settings: Settings) -> tuple[bool, str]:
        """Whether the model speculates, and its draft model's path ("" for prompt lookup)."""
        enabled = self.declared.get("speculation", settings.speculation)
        draft = self.declared.get("draft_model", settings.draft_model)
        if not isinstance(enabled, bool) or not isinstance(draft, str):
            raise ValueError(
                f'{self.source}: "speculation" must be true or false, "draft_model" a path'
            )
        if draft and self.source is not None and not Path(draft).is_absolute():
            draft = str(self.source.parent / draft)  # relative to the file's folder
        return enabled, draft


def kv_quant_for(
    path: Path, default: KVQuant | None, kv_mode: str | None = None, gpu: bool = False
) -> KVQuant | None:
    """``ModelOptions.read(path).kv_quant(...)``: one question, one read."""
    return ModelOptions.read(path).kv_quant(default, kv_mode, gpu)


def speculation_for(path: Path, settings: Settings) -> tuple[bool, str]:
    """``ModelOptions.read(path).speculation(settings)``: one question, one read."""
    return ModelOptions.read(path).speculation(settings)
