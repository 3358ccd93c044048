"""Keeping what a request computes, as it computes it (DESIGN §2, §6).

The engine ends every prefill chunk on a block boundary and hands the request's
``RequestCapture`` the cache after each one: the blocks the chunk completed are cut and
handed to the ``BlockKeeper``: RAM at once, and queued for disk as one batch (one index
query per chunk), so a cancel, a disconnect, a timeout
or a crash loses at most the chunk in flight and the writer's queue. Restore points of
hybrid and sliding-window models (``restore_points``) are captured at the positions the
capture's ``plan`` names, which the engine also ends chunks on; the generation's end is
captured when the request finishes. Chain keys are extended incrementally: no work per
chunk is proportional to the prefix.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from omlx.domain.cache.blocks import PrefixHit
from omlx.domain.cache.keeper import BlockKeeper, NewObject
from omlx.domain.cache.keys import KV, STATE, WINDOW, block_key, object_key
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.ports import KVCodec
from omlx.domain.cache.restore_points import anchor_at, interior_points


class RequestCapture:
    """One request's blocks and restore points, cut from its cache on the engine thread."""

    def __init__(
        self,
        keeper: BlockKeeper,
        codec: KVCodec,
        layout: CacheLayout,
        prompt: Sequence[int],
        hit: PrefixHit | None = None,
        *,
        interior: bool = True,
        root: str | None = None,
    ) -> None:
        self._keeper = keeper
        self._codec = codec
        self._layout = layout
        self._bs = keeper.block_size
        self._ns = root or keeper.namespace.digest  # a tenant's chain root, or the namespace
        self._chunk: list[NewObject] = []  # new in RAM since the last hand-over, for disk
        self.tokens = list(prompt)
        restored = hit.cached_tokens if hit is not None else 0
        full = restored // self._bs
        self._keys: list[str] = list(hit.keys[:full]) if hit is not None else []
        self._window_ring: deque[tuple[int, Any]] = deque(maxlen=self._ring_size())
        self._decode_next = 0  # the next block whose window KV decode should cut
        self.plan = self._plan(len(self.tokens), restored, hit, interior)
        self.stored_blocks = 0
        self.stored_points: list[int] = []

    # ---- what the engine asks --------------------------------------------------

    def _plan(
        self, length: int, restored: int, hit: PrefixHit | None, interior: bool
    ) -> tuple[int, ...]:
        """Positions past ``restored`` to capture a restore point at, during prefill."""
        if self._layout.plain or length < 2:
            return ()
        points = set(interior_points(length, self._bs, after=restored)) if interior else set()
        points.add(length - 1)  # a replay of this prompt restores to its last-but-one token
        if hit is not None and hit.matched > restored:
            points.add(hit.matched)  # where it left the cached prefix: the next one hits here
        return tuple(sorted(p for p in points if restored < p < length))

    # ---- after each prefill chunk ------------------------------------------------

    def prefilled(self, cache: Any, position: int) -> None:
        """The cache now holds positions ``[0, position)``: keep what they completed."""
        bs = self._bs
        first_new = len(self._keys)
        self._cut_blocks(cache, position // bs)
        if self._layout.window is not None:
            for j in range(first_new, position // bs):
                if self._window_wanted(j):
                    self._put_window_block(cache, j)
                else:
                    self._window_ring.append((j, None))
        if position in self.plan:
            self._put_point(cache, position)
        self._hand_over()

    def wants_decoded(self, position: int) -> bool:
        """Whether ``decoded`` has work at ``position``: a block completed since the last call."""
        return self._layout.window is not None and position // self._bs > max(
            self._decode_next, len(self._keys)
        )

    def decoded(self, cache: Any, position: int) -> None:
        """During decode (sliding layers only): the cache holds ``[0, position)``.

        The window KV of blocks completed since the last call is kept in RAM until the
        request ends, when those within a window of the end are stored: by then their
        positions have rotated out of the cache.
        """
        window, bs = self._layout.window, self._bs
        if window is None:
            return
        for j in range(max(self._decode_next, len(self._keys)), position // bs):
            if position - j * bs <= window:  # still wholly in the rotating window
                self._window_ring.append((j, self._codec.split_window(cache, j * bs, (j + 1) * bs)))
        self._decode_next = max(self._decode_next, position // bs)

    def finished(self, tokens: Sequence[int], cache: Any) -> None:
        """The request ended: ``cache`` holds exactly ``tokens`` (prompt and generated)."""
        self.tokens = list(tokens)
        end = len(self.tokens)
        if end == 0:
            return
        self._cut_blocks(cache, end // self._bs)
        if end % self._bs:
            anchor, parent, block = anchor_at(self.tokens, self._keys, self._ns, self._bs, end)
            payload = self._codec.split(cache, end - len(block), end)
            self._keep(self._keeper.kv(anchor, parent, block, payload))
        if not self._layout.plain:
            if self._layout.window is not None:
                self._put_window_tail(cache, end)
            self._put_point(cache, end)
        self._hand_over()

    # ---- cutting ---------------------------------------------------------------------

    def _cut_blocks(self, cache: Any, upto: int) -> None:
        """Cut full KV blocks ``len(keys) .. upto - 1`` (those not yet known)."""
        bs = self._bs
        for j in range(len(self._keys), upto):
            parent = self._keys[-1] if self._keys else self._ns
            block = tuple(self.tokens[j * bs : (j + 1) * bs])
            key = block_key(parent, block)
            self._keys.append(key)
            if not self._keeper.holds(key):
                payload = self._codec.split(cache, j * bs, (j + 1) * bs)
                self._keep(self._keeper.kv(key, parent, block, payload))

    def _keep(self, obj: NewObject) -> None:
        """Into RAM at once; to disk with the rest of the chunk (``_hand_over``)."""
        if self._keeper.keep(obj):
            self._chunk.append(obj)
            if obj.meta.kind == KV:
                self.stored_blocks += 1

    def _hand_over(self) -> None:
        """What this call cut goes to disk as one batch (one index query)."""
        chunk, self._chunk = self._chunk, []
        if chunk:
            self._keeper.keep_chunk(chunk)

    def _put_object(
        self, kind: str, anchor: str, parent: str, tokens: Sequence[int], payload: Any
    ) -> None:
        self._keep(
            self._keeper.point_object(kind, object_key(kind, anchor), parent, tokens, payload)
        )

    def _window_wanted(self, j: int) -> bool:
        """Whether block ``j``'s window KV lies within a window before a planned point."""
        window, bs = self._layout.window, self._bs
        return any(j * bs < p and (j + 1) * bs > p - window for p in self.plan if (j + 1) * bs <= p)

    def _put_window_block(self, cache: Any, j: int) -> None:
        bs = self._bs
        payload = self._codec.split_window(cache, j * bs, (j + 1) * bs)
        self._window_ring.append((j, payload))
        parent = self._keys[j - 1] if j else self._ns
        self._put_object(WINDOW, self._keys[j], parent, self.tokens[j * bs : (j + 1) * bs], payload)

    def _put_window_tail(self, cache: Any, end: int) -> None:
        """The window objects before ``end`` that only the decode ring still holds."""
        window, bs = self._layout.window, self._bs
        for j, payload in self._window_ring:
            if payload is None or (j + 1) * bs <= end - window or (j + 1) * bs > end:
                continue
            parent = self._keys[j - 1] if j else self._ns
            self._put_object(
                WINDOW, self._keys[j], parent, self.tokens[j * bs : (j + 1) * bs], payload
            )

    def _put_point(self, cache: Any, position: int) -> None:
        """The restore point at ``position``: the state snapshot, the partial window block."""
        anchor, parent, block = anchor_at(self.tokens, self._keys, self._ns, self._bs, position)
        codec = self._codec
        if self._layout.window is not None and position % self._bs:
            payload = codec.split_window(cache, position - len(block), position)
            self._put_object(WINDOW, anchor, parent, block, payload)
        if self._layout.has_state:
            self._put_object(STATE, anchor, parent, block, codec.snapshot(cache))
        self.stored_points.append(position)

    def _ring_size(self) -> int:
        window = self._layout.window
        return 1 if window is None else -(-window // self._bs) + 2
