"""Dequantized copies of GGUF models, kept so the next start loads instead of dequantizing.

On the CPU a GGUF's weights are dequantized to float32 at every load (MLX's quantized
matmul is slow there): for the default model that, with building its tokenizer from the
GGUF metadata, is ~1.6 s of a ~2.5 s load. After a load the model's float32 weights, its
config and tokenizer files are written once, in the background, as an mlx-lm folder
named by the GGUF file's digest; the next load of the same file reads that folder (a
safetensors read: ~0.25 s for the default model's 538 MB) and builds the same model.

The copies live in ``<cache folder>/.prepared-weights/`` (a dot folder, which the block
files' walk skips) under a byte budget: least recently loaded copies go first, and a
model whose copy alone exceeds the budget gets none. A folder appears only whole (written
under a temporary name, its manifest last, then renamed), so a crash mid-write leaves a
temporary folder that a later start removes, never a half copy that loads.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import mlx.core as mx

from omlx.adapters.blockfiles.format import RawTensor, encode_header
from omlx.adapters.mlx.models.gguf import LoadedGGUF, build_model
from omlx.adapters.mlx.models.gguf_tokenizer import eos_token_ids, write_tokenizer_files
from omlx.adapters.mlx.models.prepared_folder import (  # noqa: F401  (PREPARED_DIR re-exported)
    MANIFEST,
    PREPARED_DIR,
    TEMP_PREFIX,
    PreparedCopy,
    list_copies,
)
from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer

log = logging.getLogger(__name__)

# Bumped when what a copy holds changes (its dtype, names or files): old copies then
# stop matching and age out under the budget.
FORMAT = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# A temporary folder this old is a crashed write (a write takes seconds), not one running.
STALE_TEMP_SECONDS = 600.0
# Never fill the disk: a copy is skipped when less than this would be left free.
FREE_SPACE_RESERVE = 2 * 10**9

_ST_DTYPES = {
    mx.float32: "F32",
    mx.float16: "F16",
    mx.bfloat16: "BF16",
    mx.uint32: "U32",
    mx.int32: "I32",
}


class PreparedWeights:
    """The dequantized copies under ``root``, at most ``max_bytes`` of them."""

    def __init__(self, root: Path | str, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # one write (and its evictions) at a time
        self._remove_stale_temps()

    def folder(self, digest: str) -> Path:
        return self.root / f"{digest[:40]}-v{FORMAT}"

    # ---- reading ------------------------------------------------------------------------

    def load(self, digest: str) -> LoadedGGUF | None:
        """The model from its copy, or None when there is none (or it is unreadable)."""
        folder = self.folder(digest)
        manifest_path = folder / MANIFEST
        if not manifest_path.is_file():
            return None
        started = time.perf_counter()
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if manifest.get("format") != FORMAT or manifest.get("source_digest") != digest:
                raise ValueError(f"manifest of another copy: {manifest!r:.200}")
            weights_path = folder / WEIGHTS_FILE
            if weights_path.stat().st_size != manifest["weights_bytes"]:
                raise ValueError("weights file of the wrong size")
            config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
            weights = mx.load(str(weights_path))
            tokenizer = load_tokenizer(folder, eos_token_ids=manifest["eos_token_ids"] or None)
            model, weights = build_model(config, weights)
        except (OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
            log.warning(
                "prepared copy %s is unreadable (%s); removing it, the GGUF loads instead",
                folder,
                exc,
            )
            shutil.rmtree(folder, ignore_errors=True)
            return None
        os.utime(manifest_path)  # its recency, for the budget
        log.info(
            "loaded the prepared float32 copy of %s from %s in %.2f s",
            manifest.get("source", "?"),
            folder,
            time.perf_counter() - started,
        )
        return LoadedGGUF(
            model=model, tokenizer=tokenizer, config=config, metadata={}, weights=weights
        )

    def copies(self) -> list[PreparedCopy]:
        """The complete copies, least recently loaded first."""
        return list_copies(self.root)

    # ---- writing ------------------------------------------------------------------------

    def keep(
        self,
        digest: str,
        loaded: LoadedGGUF,
        source: Path,
        proceed: Callable[[], bool] = lambda: True,
    ) -> Path | None:
        """Write the copy now; its folder, or None when the budget or the disk refuses it.

        ``proceed`` is called between the write's steps (it may wait: the server pauses
        the write while the model serves); False abandons the write, leaving nothing.
        """
        need = sum(w.nbytes for w in loaded.weights.values())
        if any(w.dtype not in _ST_DTYPES for w in loaded.weights.values()):
            return None
        with self._lock:
            final = self.folder(digest)
            if final.is_dir():
                return final
            if need > self.max_bytes:
                log.info(
                    "no prepared copy of %s: its %d bytes exceed prepared_weights_max_size (%d)",
                    source,
                    need,
                    self.max_bytes,
                )
                return None
            self._make_room(need)
            self.root.mkdir(parents=True, exist_ok=True)
            if shutil.disk_usage(self.root).free < need + FREE_SPACE_RESERVE:
                log.info("no prepared copy of %s: the disk has too little free space", source)
                return None
            started = time.perf_counter()
            temp = self.root / f"{TEMP_PREFIX}{final.name}-{os.getpid()}"
            shutil.rmtree(temp, ignore_errors=True)
            temp.mkdir()
            try:
                if not proceed():
                    shutil.rmtree(temp, ignore_errors=True)
                    return None
                write_tokenizer_files(loaded.metadata, temp)
                (temp / CONFIG_FILE).write_text(
                    json.dumps(loaded.config, indent=2), encoding="utf-8"
                )
                weights_bytes = write_safetensors(
                    temp / WEIGHTS_FILE, loaded.weights, {"format": "mlx"}, proceed
                )
                if weights_bytes is None:
                    shutil.rmtree(temp, ignore_errors=True)
                    log.info("abandoned the prepared copy of %s: the model was unloaded", source)
                    return None
                manifest = {
                    "format": FORMAT,
                    "source": str(source),
                    "source_digest": digest,
                    "eos_token_ids": sorted(eos_token_ids(loaded.metadata)),
                    "weights_bytes": weights_bytes,
                    "written_at": time.time(),
                }
                (temp / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
                _fsync_tree(temp)
                try:
                    os.rename(temp, final)
                except OSError:
                    if not (final / MANIFEST).is_file():
                        raise
                    shutil.rmtree(temp, ignore_errors=True)  # a server sharing the folder was first
                    return final
            except BaseException:
                shutil.rmtree(temp, ignore_errors=True)
                raise
        log.info(
            "wrote the prepared float32 copy of %s (%d MB) in %.1f s: the next start loads it "
            "instead of dequantizing",
            source,
            weights_bytes // 10**6,
            time.perf_counter() - started,
        )
        return final

    def _make_room(self, need: int) -> None:
        copies = self.copies()
        used = sum(c.nbytes for c in copies)
        for copy in copies:  # least recently loaded first
            if used + need <= self.max_bytes:
                break
            shutil.rmtree(copy.path, ignore_errors=True)
            used -= copy.nbytes
            log.info(
                "removed the prepared copy %s (%d MB) for the budget",
                copy.path,
                copy.nbytes // 10**6,
            )

    def _remove_stale_temps(self) -> None:
        if not self.root.is_dir():
            return
        now = time.time()
        for entry in self.root.iterdir():
            if (
                entry.name.startswith(TEMP_PREFIX)
                and now - entry.stat().st_mtime > STALE_TEMP_SECONDS
            ):
                shutil.rmtree(entry, ignore_errors=True)


def write_safetensors(
    path: Path,
    tensors: Mapping[str, mx.array],
    metadata: Mapping[str, str],
    proceed: Callable[[], bool] = lambda: True,
) -> int | None:
    """Stream evaluated arrays into a safetensors file without an in-memory copy; its size,
    or None when ``proceed`` (called before each tensor) said False.

    Not ``mx.save_safetensors``: this runs beside the engine thread, and reading evaluated
    arrays through the buffer protocol is all it asks of MLX.
    """
    views = {
        name: RawTensor(_ST_DTYPES[value.dtype], tuple(value.shape), memoryview(value))
        for name, value in tensors.items()
    }
    for name, view in views.items():
        if not view.data.c_contiguous:
            raise ValueError(f"{name}: not a contiguous evaluated array")
    head = encode_header(views, metadata)  # also checks each view's size against its shape
    with path.open("wb") as f:
        f.write(head)
        for view in views.values():
            if not proceed():
                return None
            f.write(view.data)
        f.flush()
        os.fsync(f.fileno())
    return len(head) + sum(v.nbytes for v in views.values())


def _fsync_tree(folder: Path) -> None:
    for entry in folder.iterdir():
        with entry.open("rb") as f:
            os.fsync(f.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
