"""Load an optimized BLAS before mlx so its CPU backend uses it (DESIGN §5).

The ``mlx[cpu]`` wheel bundles a reference BLAS about 40x slower than OpenBLAS
on matrix products; a BLAS loaded with ``RTLD_GLOBAL`` before the first
``import mlx.core`` takes its place. This module must not import mlx itself.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
from pathlib import Path

log = logging.getLogger(__name__)

# Debian's libopenblas0-pthread / -openmp / -serial and the generic alternatives.
_CANDIDATES = (
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/openblas-openmp/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
    "/usr/lib/{arch}-linux-gnu/openblas-serial/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

_loaded: str | None = None
_decided = False


def candidate_paths() -> list[Path]:
    """Where an optimized BLAS may live, ``OMLX_BLAS`` first."""
    override = os.environ.get("OMLX_BLAS")
    if override:
        return [Path(override)]
    arch = platform.machine()
    return [Path(p.format(arch=arch)) for p in _CANDIDATES]


def load_optimized_blas() -> str | None:
    """Load the first BLAS found; return its path, or None (then mlx runs slowly).

    Idempotent. On macOS nothing is needed: mlx uses Accelerate and Metal.
    """
    global _loaded, _decided
    if _decided:
        return _loaded
    _decided = True
    if sys.platform != "linux":
        return None
    if "mlx.core" in sys.modules:
        log.warning("mlx was imported before the BLAS fix; the reference BLAS stays in use")
        return None
    for path in candidate_paths():
        if not path.exists():
            continue
        try:
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            log.warning("could not load BLAS %s: %s", path, exc)
            continue
        _loaded = str(path)
        return _loaded
    if os.environ.get("OMLX_BLAS"):
        log.warning("OMLX_BLAS=%s does not exist", os.environ["OMLX_BLAS"])
    return None


def describe_blas() -> str:
    """One line for the log saying which BLAS mlx will use."""
    if sys.platform != "linux":
        return "BLAS: platform default (Accelerate/Metal)"
    if _loaded:
        return f"BLAS: optimized ({_loaded})"
    return (
        "BLAS: mlx's bundled reference BLAS (about 40x slower); "
        "install libopenblas0-pthread or set OMLX_BLAS to a BLAS library"
    )


def log_blas() -> None:
    """Log ``describe_blas()``: a warning when mlx is left with the slow reference BLAS."""
    slow = sys.platform == "linux" and not _loaded
    log.log(logging.WARNING if slow else logging.INFO, describe_blas())
