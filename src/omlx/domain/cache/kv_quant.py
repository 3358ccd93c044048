"""The KV quantization setting (``kv_bits``, ``kv_group_size``): what blocks are stored as.

Store-only: the running cache stays in the model's KV dtype; each block is quantized
(mlx's affine ``quantize``: per group of ``group_size`` values along the head dimension,
``bits``-bit codes with a scale and a bias) when it is cut, kept so in both tiers, and
dequantized when a restore assembles it. The setting enters the namespace (DESIGN §4):
blocks of two settings never mix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BITS = (8, 4)
GROUP_SIZES = (32, 64, 128)
OFF = "off"


@dataclass(frozen=True, slots=True)
class KVQuant:
    """``bits`` per value (8 or 4), in groups of ``group_size`` values along head_dim."""

    bits: int
    group_size: int = 64

    def __post_init__(self) -> None:
        if self.bits not in BITS:
            raise ValueError(f"kv_bits must be off, 8 or 4, not {self.bits!r}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"kv_group_size must be one of {GROUP_SIZES}, not {self.group_size!r}")

    @property
    def label(self) -> str:
        """Short form for block metadata and logs: ``q8g64``."""
        return f"q{self.bits}g{self.group_size}"

    def identity(self) -> dict[str, Any]:
        """The namespace's part: only present when on, so ``off`` keeps today's digests."""
        return {"bits": self.bits, "group_size": self.group_size, "mode": "store"}


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


def kv_quant_of(bits: object, group_size: object = 64) -> KVQuant | None:
    """The setting from its two keys; None when ``bits`` is off."""
    parsed = parse_kv_bits(bits)
    if parsed is None:
        return None
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"kv_group_size must be an integer, not {group_size!r}")
    return KVQuant(parsed, group_size)


def model_override(declared: Mapping[str, Any], default: KVQuant | None) -> KVQuant | None:
    """A model's own ``kv_bits`` / ``kv_group_size`` (its ``omlx.json``) over the server's."""
    if "kv_bits" not in declared and "kv_group_size" not in declared:
        return default
    bits = declared.get("kv_bits", default.bits if default else OFF)
    group = declared.get("kv_group_size", default.group_size if default else 64)
    return kv_quant_of(bits, group)
