"""What the codec cuts and joins: a block's KV (one group per shape, plain or quantized),
and a snapshot of state layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from omlx.adapters.mlx.cache.quantized import QuantizedKVBlock


@dataclass(frozen=True, slots=True)
class KVBlock:
    """One block of some leaves, stacked: arrays shaped (leaves, 1, kv_heads, positions, head_dim).

    Stacking makes cutting a block one copy instead of two per layer. ``keys`` and
    ``values`` are MLX arrays for a block cut from a live cache, numpy views of the file's
    bytes for one read from disk (bf16 as its uint16 bits); ``dtype`` is the KV dtype
    either way. ``leaves`` are the layout's leaf indices the rows belong to.
    """

    keys: mx.array | np.ndarray
    values: mx.array | np.ndarray
    nbytes: int
    dtype: mx.Dtype
    leaves: tuple[int, ...] = ()

    @property
    def layer_count(self) -> int:
        return self.keys.shape[0]

    @property
    def positions(self) -> int:
        return self.keys.shape[3]


@dataclass(frozen=True, slots=True)
class Blocks:
    """One stored block of leaves whose shapes differ: a ``KVBlock`` per shape group."""

    groups: tuple[KVBlock | QuantizedKVBlock, ...]
    positions: int

    @property
    def nbytes(self) -> int:
        return sum(g.nbytes for g in self.groups)


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """The state leaves' arrays after a position: per leaf, its slots (None where empty)."""

    leaves: tuple[int, ...]
    arrays: tuple[tuple[Any, ...], ...]  # mx arrays, or (numpy view, mx dtype) read from disk
    nbytes: int


def one_or_groups(groups: tuple[Any, ...], positions: int) -> KVBlock | Blocks:
    """One group as itself; several as a ``Blocks``."""
    return groups[0] if len(groups) == 1 else Blocks(groups, positions)


def groups_of(payload: Any) -> tuple[Any, ...]:
    """A block's groups (a lone ``KVBlock`` or ``QuantizedKVBlock`` is one)."""
    return payload.groups if isinstance(payload, Blocks) else (payload,)
