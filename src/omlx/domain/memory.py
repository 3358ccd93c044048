"""Memory arithmetic: what a request's cache costs, and the process-wide account of models.

mlx-lm's batch caches are rectangular: every row of a ``BatchKVCache`` is as long as the
longest row (shorter ones are left-padded), and the buffer grows in steps of 256
positions. So a batch of ``n`` requests whose longest one may reach ``L`` positions
(prompt + max_tokens) holds up to ``n * ceil256(L)`` positions of KV, whatever the
others' lengths: ``KVBudget`` reserves that upper bound.

``MemoryAccount`` adds what several models hold at once: their weights and their KV (the
running batch and the hot tier), against one limit, so a model is loaded only when it
fits beside the others and a request is admitted only when its KV does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

# Re-exported: the engine and the MLX memory adapter print the guard's sizes with it.
from omlx.domain.sizes import format_bytes as format_bytes

# BatchKVCache.step in mlx_lm.models.cache: rows grow in chunks of this many positions.
CACHE_STEP = 256


@dataclass(frozen=True, slots=True)
class KVCost:
    """What one request's cache costs, by what each layout really holds.

    ``per_token``: bytes per position of the full-attention layers (they keep every
    position); ``window_per_token``: bytes per position of the sliding layers, which keep
    at most ``window`` positions plus a prefill chunk; ``fixed``: the recurrent layers'
    state, the same at any length.
    """

    per_token: int
    window_per_token: int = 0
    window: int = 0
    fixed: int = 0

    def row_bytes(self, positions: int) -> int:
        windowed = min(positions, self.window + CACHE_STEP) if self.window else 0
        return positions * self.per_token + windowed * self.window_per_token + self.fixed


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The guard's arithmetic; cheap enough to call every step."""

    limit_bytes: int
    bytes_per_token: int
    cost: KVCost | None = None  # the whole layout's; None: full attention only

    @property
    def _cost(self) -> KVCost:
        return self.cost if self.cost is not None else KVCost(self.bytes_per_token)

    def positions(self, length: int) -> int:
        """Cache positions a row of ``length`` tokens occupies (rounded up to the growth step)."""
        return -(-max(length, 1) // CACHE_STEP) * CACHE_STEP

    def batch_bytes(self, lengths: Iterable[int]) -> int:
        """Upper bound of the KV of requests that may each reach ``lengths`` positions together."""
        lengths = list(lengths)
        if not lengths:
            return 0
        return len(lengths) * self._cost.row_bytes(self.positions(max(lengths)))

    def fits_alone(self, length: int, limit: int | None = None) -> bool:
        return self.batch_bytes([length]) <= (self.limit_bytes if limit is None else limit)

    @property
    def token_capacity(self) -> int:
        """The most positions (prompt + max_tokens) one request may reserve on its own."""
        cost = self._cost
        room = self.limit_bytes - cost.fixed - (cost.window + CACHE_STEP) * cost.window_per_token
        if cost.per_token <= 0:
            return 1 << 62 if room >= 0 else 0
        steps = max(room, 0) // (cost.per_token * CACHE_STEP)
        return steps * CACHE_STEP


class MemoryAccount:
    """Weights and KV held by the loaded models, against one limit (None: unbounded).

    Thread-safe: each model's engine thread updates its own KV; the model pool adds and
    drops weights.
    """

    def __init__(self, limit_bytes: int | None) -> None:
        self.limit_bytes = limit_bytes
        self._weights: dict[str, int] = {}
        self._kv: dict[str, int] = {}
        self._lock = threading.Lock()

    def set_weights(self, model: str, nbytes: int) -> None:
        with self._lock:
            self._weights[model] = nbytes

    def set_kv(self, model: str, nbytes: int) -> None:
        """The KV ``model`` holds now: its running batch's reservation and its hot tier."""
        with self._lock:
            self._kv[model] = nbytes

    def drop(self, model: str) -> None:
        with self._lock:
            self._weights.pop(model, None)
            self._kv.pop(model, None)

    def held(self) -> int:
        with self._lock:
            return sum(self._weights.values()) + sum(self._kv.values())

    def weights(self, model: str) -> int:
        with self._lock:
            return self._weights.get(model, 0)

    def room_for_kv(self, model: str) -> int | None:
        """What ``model``'s KV may reach beside everything else held; None: unbounded."""
        if self.limit_bytes is None:
            return None
        with self._lock:
            others = sum(self._weights.values()) + sum(v for k, v in self._kv.items() if k != model)
        return self.limit_bytes - others

    def others_kv(self, model: str) -> int:
        """KV the other models hold (it frees as their requests finish; weights do not)."""
        with self._lock:
            return sum(v for k, v in self._kv.items() if k != model)

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {
                m: {"weights": self._weights.get(m, 0), "kv": self._kv.get(m, 0)}
                for m in {*self._weights, *self._kv}
            }
