"""Keeping new blocks: RAM at once, then queued once for disk (write-through, DESIGN §6).

A request hands over what one prefill chunk (or its end) completed as one batch: the
blocks go to the hot tier, and the cold tier is asked which of them it already holds in
one query (``ColdSource.present``), not one per block: with a shared PostgreSQL index
that is one network round trip per chunk on the request path, not one per block.

The writer's queue is bounded and the request path never waits for it: a long first
prompt computed faster than the disk writes (an agent's 20k tokens: 300 blocks) outruns
it. Blocks it has no room for are *deferred*, not dropped: RAM still holds them, every
later turn of the conversation reuses them from there (so nothing would queue them
again), and a restart would cut every later turn's restore at the first one. They are
queued, oldest first, as room comes: before each later chunk's blocks, when the engine
is idle, and at the stop (``write_deferred``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import KV
from omlx.domain.cache.ports import ColdSource, KVCodec
from omlx.domain.cache.tally import Tally

log = logging.getLogger(__name__)


class KnownKeys:
    """Keys queued for (or read from) the cold tier, most recent last; bounded.

    Spares asking the index again about a block this process already wrote or read; a
    forgotten key only costs that question.
    """

    def __init__(self, limit: int = 1 << 16) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def remember(self, key: str) -> None:
        keys = self._keys  # one dict throughout: ``forget`` may swap it from another thread
        keys[key] = None
        keys.move_to_end(key)
        while len(keys) > self._limit:
            keys.popitem(last=False)

    def discard(self, keys: Iterable[str]) -> None:
        """Forget ``keys`` (removed from disk): a block computed again is queued again."""
        known = self._keys
        for key in keys:
            known.pop(key, None)

    def forget(self) -> None:
        """Forget every key (an admin removed blocks from disk): swapped, not cleared in place."""
        self._keys = OrderedDict()


@dataclass(frozen=True, slots=True)
class NewObject:
    """One object a request computed: a KV block, or a restore point's window or state."""

    meta: BlockMeta
    tokens: tuple[int, ...]
    payload: Any


class BlockKeeper:
    """Puts a request's new blocks and restore-point objects in RAM and queues them for disk."""

    def __init__(
        self,
        *,
        namespace: NamespaceInfo,
        codec: KVCodec,
        hot: HotTier,
        cold: ColdSource | None,
        known: KnownKeys,
        tally: Tally,
        server_id: str = "",
        deferred_limit: int = 1 << 16,
    ) -> None:
        self.namespace = namespace
        self.block_size = namespace.block_size
        self._codec, self._hot, self._cold = codec, hot, cold
        self._known, self._tally = known, tally
        self.server_id = server_id  # recorded with each object as the server that computed it
        # Keys in RAM the writer had no room for, oldest first (queued by ``write_deferred``).
        self._deferred: OrderedDict[str, None] = OrderedDict()
        self._deferred_limit = deferred_limit

    def holds(self, key: str) -> bool:
        """Whether ``key`` is in RAM (touched: a request is using it again); skips cutting it."""
        return self._hot.touch(key)

    def kv(self, key: str, parent: str, tokens: Sequence[int], payload: Any) -> NewObject:
        """A KV block (full, or a request's trailing partial one) to keep."""
        meta = BlockMeta(
            key, parent, self.namespace.digest, len(tokens), computed_by=self.server_id
        )
        return NewObject(meta, tuple(tokens), payload)

    def point_object(
        self, kind: str, key: str, parent: str, tokens: Sequence[int], payload: Any
    ) -> NewObject:
        """A restore point's ``kind`` object, ``key`` = ``object_key(kind, anchor)``."""
        meta = BlockMeta(
            key, parent, self.namespace.digest, len(tokens), kind, computed_by=self.server_id
        )
        return NewObject(meta, tuple(tokens), payload)

    def keep(self, obj: NewObject) -> bool:
        """Put ``obj`` in RAM at once; False when RAM holds it already (then only touched).

        A new object is for ``keep_chunk`` to write through once its chunk is cut.
        """
        if self._hot.touch(obj.meta.key):
            return False
        # An object that does not fit in RAM still goes to disk.
        self._hot.put(obj.meta, obj.tokens, obj.payload, self._codec.nbytes(obj.payload))
        if obj.meta.kind == KV:
            self._tally.add(stored_blocks=1)
        else:
            self._tally.add(stored_objects=1, object_bytes=self._codec.nbytes(obj.payload))
        return True

    def keep_chunk(self, new: Sequence[NewObject]) -> None:
        """Queue one chunk's new objects for disk, asking the cold tier about them once.

        Keys this process queued or read before are not asked about; of the rest, those
        the cold tier lacks are encoded here (the engine thread: the writer gets bytes
        only) and queued, after the deferred ones, while the writer has room; the others
        are deferred.
        """
        if self._cold is None:
            return
        self.write_deferred()
        unknown = [o for o in new if o.meta.key not in self._known]
        if not unknown:
            return
        on_disk = self._cold.present([o.meta.key for o in unknown])
        queued = 0
        for obj in unknown:
            key = obj.meta.key
            if key in on_disk:
                self._known.remember(key)
            elif self._deferred or not self._cold.has_room():
                self._defer(key)  # after the older ones: a chain is restored from its head
            elif self._queue(obj.meta, obj.tokens, obj.payload):
                queued += 1
        if queued:
            self._tally.add(queued_blocks=queued)

    def write_deferred(self) -> int:
        """Queue the deferred objects RAM still holds, oldest first, while the writer has
        room (engine thread); how many were queued. One that left RAM is let go: a request
        that needs it computes it again, and queues it then."""
        if self._cold is None:
            return 0
        queued = 0
        while self._deferred and self._cold.has_room():
            key, _ = self._deferred.popitem(last=False)
            block = self._hot.peek(key)
            if block is None or key in self._known:
                continue
            if not self._queue(block.meta, block.tokens, block.payload):
                self._deferred.move_to_end(key, last=False)  # still the oldest
                break
            queued += 1
        if queued:
            self._tally.add(queued_blocks=queued, deferred_written=queued)
            log.debug(
                "queued %d blocks for disk that waited for room in the writer's queue (%d wait)",
                queued,
                len(self._deferred),
            )
        return queued

    def _queue(self, meta: BlockMeta, tokens: Sequence[int], payload: Any) -> bool:
        """Encode and queue one object; deferred (False) when the writer takes nothing."""
        assert self._cold is not None
        data = self._codec.encode(payload, tokens, meta)
        if not self._cold.put(meta, tokens, data):
            self._defer(meta.key)
            return False
        self._known.remember(meta.key)
        return True

    def _defer(self, key: str) -> None:
        if key not in self._deferred:
            self._tally.add(deferred_blocks=1)
        self._deferred[key] = None
        while len(self._deferred) > self._deferred_limit:  # a writer that never drains
            self._deferred.popitem(last=False)
            self._tally.add(deferred_dropped=1)
