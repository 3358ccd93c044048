"""Resolve ``--model`` to a loaded model: an mlx-lm folder, a GGUF file, or the default.

Also computes what the cache namespace needs to know about the model: a digest
of its weights and tokenizer files, its KV dtype and layer count.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from omlx.adapters.mlx.cache.layout import ModelLayout, probe_model
from omlx.adapters.mlx.models.errors import UnsupportedModelError
from omlx.adapters.mlx.models.generation_config import (
    BUNDLED_GENERATION_CONFIG,
    read_generation_config,
)
from omlx.adapters.mlx.models.gguf import (
    DEFAULT_MODEL_ID,
    LoadedGGUF,
    default_model_path,
    load_gguf,
)
from omlx.adapters.mlx.models.prepared import PreparedWeights
from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer
from omlx.adapters.mlx.vision.loader import PROCESSOR_FILES, is_vision_folder, load_vision
from omlx.domain.cache.blocks import NamespaceInfo
from omlx.domain.cache.keys import namespace_digest
from omlx.domain.cache.kv_quant import KVQuant
from omlx.domain.memory import KVCost
from omlx.domain.model_ids import model_id_for

log = logging.getLogger(__name__)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    *PROCESSOR_FILES,
)

# A callable that returns a remembered digest for (path, size, mtime) or computes and stores it.
DigestCache = Callable[[Path, Callable[[Path], str]], str]
# Makes a counter for (label, total bytes) with ``advance(n)`` and ``close()``: the
# weight digest's progress (hashing a large model's weights takes minutes).
ProgressFactory = Callable[[str, int], Any]


@dataclass(slots=True)
class LoadedModel:
    """A model ready to run, with what identifies its KV cache."""

    model_id: str
    path: Path
    model: nn.Module
    tokenizer: Any  # mlx-lm's TokenizerWrapper (tokenizer_loader)
    config: dict[str, Any]
    context_length: int
    layer_count: int
    kv_dtype: str
    kv_cost: KVCost  # what one request's cache costs (for the memory guard)
    cache_supported: bool
    weights_digest: str
    tokenizer_digest: str
    cache_unsupported_reason: str = ""
    layout: ModelLayout | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Sampling defaults for what a request leaves out (temperature, top_p, ...).
    generation_config: dict[str, Any] = field(default_factory=dict)

    def namespace(self, block_size: int, kv_quant: KVQuant | None = None) -> NamespaceInfo:
        """The cache namespace of this model at ``block_size`` and ``kv_quant`` (DESIGN §4).

        Its ``kv_dtype`` names what blocks are stored as: ``q8g64/float32`` when quantized.
        """
        dtype = self.kv_dtype if kv_quant is None else f"{kv_quant.label}/{self.kv_dtype}"
        return NamespaceInfo(
            digest=namespace_digest(self.identity(block_size, kv_quant)),
            model_name=self.model_id,
            model_path=str(self.path),
            block_size=block_size,
            kv_dtype=dtype,
            layer_count=self.layer_count,
        )

    def identity(self, block_size: int, kv_quant: KVQuant | None = None) -> dict[str, Any]:
        """What makes this model's KV reusable (DESIGN §4), for ``namespace_digest``."""
        identity = {
            "config": self.config,
            "weights_digest": self.weights_digest,
            "tokenizer_digest": self.tokenizer_digest,
            "kv_dtype": self.kv_dtype,
            "block_size": block_size,
        }
        if kv_quant is not None:  # a separate field: off keeps the digests it always had
            identity["kv_quantization"] = kv_quant.identity()
        if self.layout is not None:  # class and shapes per layer: objects fit only this layout
            identity["cache_layout"] = list(self.layout.signature)
        return identity


def file_sha256(path: Path, advance: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            if advance is not None:
                advance(len(chunk))
    return h.hexdigest()


def files_digest(paths: Iterable[Path], digest_one: Callable[[Path], str] = file_sha256) -> str:
    """One digest over several files, by name and content digest, order-independent."""
    h = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        h.update(path.name.encode())
        h.update(bytes.fromhex(digest_one(path)))
    return h.hexdigest()


def weights_digest(
    paths: list[Path],
    digest_cache: DigestCache | None = None,
    progress: ProgressFactory | None = None,
    label: str = "digesting weights",
) -> str:
    """``files_digest`` of the weight files, remembered digests reused, bytes hashed counted.

    A remembered file counts as done at once, so the count ends at the total either way.
    """
    total = sum(p.stat().st_size for p in paths)
    counter = progress(label, total) if progress is not None else None
    advance = counter.advance if counter is not None else None

    def digest_one(path: Path) -> str:
        if digest_cache is None:
            return file_sha256(path, advance)
        hashed = []

        def compute(p: Path) -> str:
            hashed.append(p)
            return file_sha256(p, advance)

        digest = digest_cache(path, compute)
        if not hashed and advance is not None:
            advance(path.stat().st_size)
        return digest

    try:
        return files_digest(paths, digest_one)
    finally:
        if counter is not None:
            counter.close()


def load_model(
    spec: str | None,
    digest_cache: DigestCache | None = None,
    model_id: str | None = None,
    progress: ProgressFactory | None = None,
    prepared: PreparedWeights | None = None,
) -> LoadedModel:
    """Load ``spec`` (None: the default SmolLM2 GGUF) and describe its cache identity.

    ``model_id``: the id it is served under (default: from its file or folder name).
    ``progress``: counts the weight digest's bytes (see ``ProgressFactory``).
    ``prepared``: where a GGUF dequantized on the CPU is kept for the next load; a load
    that had to dequantize leaves ``extra["write_prepared_copy"]``, a call that writes the
    copy (seconds of disk writes: run it off the request path).
    """
    if spec is None:
        path, model_id = default_model_path(), model_id or DEFAULT_MODEL_ID
    else:
        path = Path(spec).expanduser()
        if not path.exists():
            raise FileNotFoundError(
                f"model {spec!r} not found: give an mlx-lm model folder or a .gguf file"
            )
        model_id = model_id or model_id_for(path)

    extra: dict[str, Any] = {}
    generation: dict[str, Any] = {}
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UnsupportedModelError(f"{path} is a file but not a .gguf file")
        weight_files = [path]
        digest = weights_digest(
            weight_files, digest_cache, progress, f"digesting the weights of {model_id}"
        )
        loaded, dequantized_now = _load_gguf(path, digest, prepared)
        if path.resolve() == default_model_path().resolve():
            generation = dict(BUNDLED_GENERATION_CONFIG)
        model, tokenizer, config = loaded.model, loaded.tokenizer, loaded.config
        if prepared is not None and dequantized_now:
            extra["write_prepared_copy"] = partial(prepared.keep, digest, loaded, path)
        # The GGUF's tokenizer lives in its metadata, already covered by the file digest.
        tokenizer_files: list[Path] = []
    else:
        if not (path / "config.json").exists():
            raise UnsupportedModelError(f"{path} has no config.json: not an mlx-lm model folder")
        if is_vision_folder(path):
            vision = load_vision(path)
            model, tokenizer, config = vision.model, vision.tokenizer, vision.config
            extra["vision"] = vision.prompter
        else:
            model, tokenizer, config = _load_folder(path)
        weight_files = sorted(path.glob("*.safetensors"))
        tokenizer_files = [path / n for n in _TOKENIZER_FILES if (path / n).exists()]
        digest = weights_digest(
            weight_files, digest_cache, progress, f"digesting the weights of {model_id}"
        )
        generation = read_generation_config(path)

    probe = probe_model(model)  # one one-token pass: layout, KV dtype and KV cost
    layout, kv_dtype = probe.layout, probe.kv_dtype
    context = int(config.get("max_position_embeddings") or config.get("context_length") or 4096)
    loaded_model = LoadedModel(
        model_id=model_id,
        path=path,
        model=model,
        tokenizer=tokenizer,
        config=config,
        context_length=context,
        layer_count=len(layout.leaves),
        kv_dtype=kv_dtype,
        kv_cost=probe.kv_cost,
        cache_supported=not layout.unsupported,
        weights_digest=digest,
        tokenizer_digest=files_digest(tokenizer_files),
        cache_unsupported_reason=layout.unsupported,
        layout=layout,
        extra=extra,
        generation_config=generation,
    )
    log.info(
        "loaded %s from %s: %d cache layers (%s), KV dtype %s, context %d",
        model_id,
        path,
        len(layout.leaves),
        ", ".join(f"{n} {label}" for label, n in layout.counts().items()),
        kv_dtype,
        context,
    )
    if generation:
        log.info(
            "sampling defaults of %s (for what a request leaves out): %s",
            model_id,
            ", ".join(f"{k} {v}" for k, v in generation.items()),
        )
    return loaded_model


def _load_folder(path: Path) -> tuple[nn.Module, Any, dict[str, Any]]:
    """An mlx-lm folder's model, tokenizer and config, as ``mlx_lm.load`` gives them, the
    tokenizer from ``tokenizer.json`` where it can be (``tokenizer_loader``)."""
    from mlx_lm.utils import load_model as mlx_lm_load_model

    model, config = mlx_lm_load_model(path)
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    return model, tokenizer, config


def _load_gguf(
    path: Path, digest: str, prepared: PreparedWeights | None
) -> tuple[LoadedGGUF, bool]:
    """The GGUF's model, from its prepared float32 copy when there is one, and whether it
    was dequantized just now (then a copy is worth writing).

    Only on the CPU: elsewhere the quantized weights load as they are, with nothing to keep.
    """
    if prepared is None or mx.default_device().type != mx.cpu:
        return load_gguf(path), False
    loaded = prepared.load(digest)
    if loaded is not None:
        return loaded, False
    return load_gguf(path, dequantize=True), True
