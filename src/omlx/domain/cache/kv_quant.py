"""The KV quantization setting (``kv_bits``, ``kv_group_size``, ``kv_mode``).

Quantized as mlx's affine ``quantize`` does it: per group of ``group_size`` values along
the head dimension, ``bits``-bit codes with a scale and a bias. Two modes:

- ``store``: the running cache stays in the model's KV dtype; each block is quantized when
  it is cut, kept so in both tiers, and dequantized when a restore assembles it. A hit is
  close to a miss, not equal to it.
- ``exact``: the running cache itself holds the codes; blocks are sliced from them and a
  restore puts the same codes back, so a hit's greedy output equals the miss's. Its
  quantized attention is mlx's fast path on a GPU and costs decode time on the CPU.

``auto`` (the default) is ``exact`` where mlx runs on a GPU and ``store`` on the CPU; the
caller resolves it (``resolve_kv_mode``). The setting, mode included, enters the namespace
(DESIGN §4): blocks of two settings never mix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

BITS = (8, 4)
GROUP_SIZES = (32, 64, 128)
OFF = "off"
STORE, EXACT, AUTO = "store", "exact", "auto"
MODES = (STORE, EXACT)


@dataclass(frozen=True, slots=True)
class KVQuant:
    """``bits`` per value (8 or 4), in groups of ``group_size`` values along head_dim; ``mode``
    ``store`` (blocks only) or ``exact`` (the running cache too)."""

    bits: int
    group_size: int = 64
    mode: str = STORE

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"kv_mode must be exact or store here, not {self.mode!r}")
        if self.bits not in BITS:
            raise ValueError(f"kv_bits must be off, 8 or 4, not {self.bits!r}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"kv_group_size must be one of {GROUP_SIZES}, not {self.group_size!r}")

    @property
    def label(self) -> str:
        """Short form for logs and the namespace's dtype: ``q8g64``, ``q8g64-exact``."""
        return f"q{self.bits}g{self.group_size}" + ("-exact" if self.exact else "")

    @property
    def exact(self) -> bool:
        return self.mode == EXACT

    def identity(self) -> dict[str, Any]:
        """The namespace's part: only present when on, so ``off`` keeps today's digests (and
        ``store``, named since it landed, keeps its own)."""
        return {"bits": self.bits, "group_size": self.group_size, "mode": self.mode}


def parse_kv_bits(value: object) -> int | None:
    """``off`` (or empty, 0, None) -> None; 8 / "8" and 4 / "4" -> that int; else ValueError."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", OFF)):
        return None
    if isinstance(value, bool):
        raise ValueError(f"kv_bits must be off, 8 or 4, not {value!r}")
    try:
        bits = int(str(value).strip())
    except ValueError:
        raise ValueError(f"kv_bits must be off, 8 or 4, not {value!r}") from None
    if bits == 0:
        return None
    if bits not in BITS:
        raise ValueError(f"kv_bits must be off, 8 or 4, not {value!r}")
    return bits


def parse_kv_mode(value: object) -> str:
    """``exact``, ``store`` or ``auto`` (any case); else ValueError naming the key."""
    mode = str(value).strip().lower() if isinstance(value, str) else None
    if mode not in (*MODES, AUTO):
        raise ValueError(f"kv_mode must be auto, exact or store, not {value!r}")
    return mode


def resolve_kv_mode(value: object, gpu: bool, bits: int = 8) -> str:
    """``auto`` as ``exact`` on a GPU at 8 bits, else ``store``; ``exact`` and ``store`` as
    they are.

    The CPU: quantized attention costs decode time there. 4 bits: every layer attending
    to 4-bit KV, the prompt's own included, raised the default model's perplexity by
    14.2% (exact-8: +0.26%; store-4, full-precision attention over restored 4-bit blocks:
    +0.84%; docs/benchmarks.md), past the quality a user asks of a cache.
    """
    mode = parse_kv_mode(value)
    if mode == AUTO:
        return EXACT if gpu and bits == 8 else STORE
    return mode


def kv_quant_of(bits: object, group_size: object = 64, mode: str = STORE) -> KVQuant | None:
    """The setting from its keys (``mode`` resolved already); None when ``bits`` is off."""
    parsed = parse_kv_bits(bits)
    if parsed is None:
        return None
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"kv_group_size must be an integer, not {group_size!r}")
    return KVQuant(parsed, group_size, mode)


def model_override(
    declared: Mapping[str, Any], default: KVQuant | None, mode: str | None = None
) -> KVQuant | None:
    """A model's own ``kv_bits`` / ``kv_group_size`` (its ``omlx.json``) over the server's,
    in ``mode`` (resolved; None: the server's setting's own)."""
    mode = mode or (default.mode if default else STORE)
    if "kv_bits" not in declared and "kv_group_size" not in declared:
        return default if default is None or default.mode == mode else replace(default, mode=mode)
    bits = declared.get("kv_bits", default.bits if default else OFF)
    group = declared.get("kv_group_size", default.group_size if default else 64)
    return kv_quant_of(bits, group, mode)
