"""Pinned prefixes: a prompt's blocks kept from eviction, in both tiers, until a deadline.

A pin holds one hot-tier pin per key of the prefix's blocks (full blocks, then the
trailing partial one): the hot tier never evicts a pinned key, and the cold tier's
eviction asks the same ``is_pinned``, so a pin protects RAM and disk alike, and keys not
yet computed are protected once they are. Pinning a prefix that is pinned already
(Claude Code re-sends its breakpoints each turn) extends that pin instead of adding one.
Pins together may hold at most ``share`` of the hot tier's byte budget: a block held in
RAM counts its own bytes, one not held yet the tier's mean block, or, while the tier is
empty, the model's own cost of a full block (``block_bytes``), so an empty tier is no
way around the share. A tenant holds at most ``max_pins`` pins. Pins live in memory, for
this process's life.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace

from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import stored_keys
from omlx.domain.ports import Clock

DEFAULT_PIN_SHARE = 0.5  # of the hot tier's budget; the rest stays plain LRU
DEFAULT_MAX_PINS = 256  # per tenant: a client re-sending breakpoints extends, never adds
MAX_PIN_SECONDS = 7 * 24 * 3600.0


class PinRefused(Exception):
    """A pin that would pass the pinned share of the budget, or asks for a TTL out of range."""


@dataclass(frozen=True, slots=True)
class Pin:
    """One pinned prefix: ``tokens`` positions of a prompt, kept until ``expires_at``."""

    id: str  # the key of the prefix's last block, shortened: the same prefix, the same id
    keys: tuple[str, ...]
    tokens: int
    created_at: float
    expires_at: float
    source: str  # "api", "cache_control" or "prompt_cache_retention"
    group: str | None = None  # the client's session (OpenAI prompt_cache_key), if it named one
    tenant: str = ""  # the API key's tenant ("": the default one)


class PinBook:
    """The pins of one prefix cache; thread-safe (the API and the engine thread both call it)."""

    def __init__(
        self,
        hot: HotTier,
        clock: Clock,
        *,
        namespace: str,
        block_size: int,
        share: float,
        block_bytes: int = 0,
        max_pins: int = DEFAULT_MAX_PINS,
    ) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError("the pinned share must be within [0, 1]")
        self._hot, self._clock = hot, clock
        self._namespace, self._block_size, self.share = namespace, block_size, share
        self._block_bytes, self.max_pins = block_bytes, max_pins
        self._pins: dict[str, Pin] = {}
        self._lock = threading.Lock()

    def keys_of(self, tokens: Sequence[int], root: str | None = None) -> tuple[str, ...]:
        """The keys of ``tokens``' blocks: every full one, then the trailing partial one."""
        return tuple(stored_keys(root or self._namespace, tokens, self._block_size))

    def pin(
        self,
        tokens: Sequence[int],
        ttl: float,
        source: str,
        group: str | None = None,
        *,
        root: str | None = None,
        tenant: str = "",
    ) -> Pin:
        """Pin ``tokens``' prefix for ``ttl`` seconds; an existing pin of it is extended.

        ``root``: the tenant's chain root (``PrefixCache.root_of``), so its own blocks are
        the ones kept.
        """
        if not 0 < ttl <= MAX_PIN_SECONDS:
            raise PinRefused(f"a pin's ttl must be within (0, {int(MAX_PIN_SECONDS)}] seconds")
        keys = self.keys_of(tokens, root)
        if not keys:
            raise PinRefused("there is nothing to pin: the prompt is empty")
        pin_id = keys[-1][:24]
        now = self._clock.now()
        with self._lock:
            self._expire_locked(now)
            held = self._pins.get(pin_id)
            if held is not None:
                extended = replace(held, expires_at=max(held.expires_at, now + ttl))
                self._pins[pin_id] = extended
                return extended
            self._check_count_locked(tenant)
            self._check_room_locked(keys)
            pin = Pin(pin_id, keys, len(tokens), now, now + ttl, source, group, tenant)
            self._pins[pin_id] = pin
            self._hot.pin(keys)
            return pin

    def unpin(self, pin_id: str, tenant: str | None = None) -> bool:
        """Drop one pin (of ``tenant``'s, when given); False when there is none by that id."""
        with self._lock:
            pin = self._pins.get(pin_id)
            if pin is None or (tenant is not None and pin.tenant != tenant):
                return False
            del self._pins[pin_id]
        if pin is None:
            return False
        self._hot.unpin(pin.keys)
        return True

    def pins(self, tenant: str | None = None) -> list[Pin]:
        """The live pins (``tenant``'s, when given), soonest to expire first."""
        with self._lock:
            self._expire_locked(self._clock.now())
            live = [p for p in self._pins.values() if tenant is None or p.tenant == tenant]
        return sorted(live, key=lambda p: p.expires_at)

    def ttl_left(self, pin: Pin) -> float:
        """Seconds until ``pin`` expires, on this book's clock (0: due)."""
        return max(pin.expires_at - self._clock.now(), 0.0)

    def expire(self) -> int:
        """Drop the pins past their deadline; how many."""
        with self._lock:
            return self._expire_locked(self._clock.now())

    def pinned_blocks(self) -> int:
        with self._lock:
            return len({k for p in self._pins.values() for k in p.keys})

    def _expire_locked(self, now: float) -> int:
        gone = [p for p in self._pins.values() if p.expires_at <= now]
        for pin in gone:
            del self._pins[pin.id]
            self._hot.unpin(pin.keys)
        return len(gone)

    def _check_count_locked(self, tenant: str) -> None:
        held = sum(1 for p in self._pins.values() if p.tenant == tenant)
        if held >= self.max_pins:
            raise PinRefused(
                f"this tenant holds {held} pins, the most one may ({self.max_pins}); "
                "unpin one or let one expire"
            )

    def _check_room_locked(self, keys: Sequence[str]) -> None:
        stats = self._hot.stats()
        mean = stats.bytes / stats.blocks if stats.blocks else float(self._block_bytes)
        wanted = {k for p in self._pins.values() for k in p.keys} | set(keys)
        held = self._hot.sizes(wanted)
        pinned = sum(held.values()) + (len(wanted) - len(held)) * mean
        allowed = self.share * stats.max_bytes
        if pinned > allowed:
            raise PinRefused(
                f"pinning {len(keys)} more blocks would hold about {pinned / 2**20:.1f} MiB "
                f"pinned, past the pinned share ({self.share:.0%} of the "
                f"{stats.max_bytes / 2**20:.0f} MiB RAM tier); unpin something or shorten the prefix"
            )
