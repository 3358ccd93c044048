"""What the prefix cache must know of a model's cache layout to restore it (DESIGN §4).

Full-attention layers are restored from KV blocks at any position. Sliding-window layers
need, at a restore point ``p``, the KV of the ``window`` positions before it; recurrent
(SSM, linear-attention) layers need their state snapshot at ``p``. A model without either
restores anywhere a KV chain reaches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheLayout:
    window: int | None = None  # the largest sliding window, if the model has sliding layers
    has_state: bool = False  # recurrent layers whose state is snapshotted

    @property
    def plain(self) -> bool:
        """Only full-attention layers: every block boundary is a restore point."""
        return self.window is None and not self.has_state
