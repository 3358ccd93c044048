"""Keeping new blocks: RAM at once, then queued once for disk (write-through, DESIGN §6).

A request hands over what one prefill chunk (or its end) completed as one batch: the
blocks go to the hot tier, and the cold tier is asked which of them it already holds in
one query (``ColdSource.present``), not one per block: with a shared PostgreSQL index
that is one network round trip per chunk on the request path, not one per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import KV
from omlx.domain.cache.ports import ColdSource, KVCodec
from omlx.domain.cache.tally import Tally


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
    ) -> None:
        self.namespace = namespace
        self.block_size = namespace.block_size
        self._codec, self._hot, self._cold = codec, hot, cold
        self._known, self._tally = known, tally
        self.server_id = server_id  # recorded with each object as the server that computed it

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
        only) and queued.
        """
        if self._cold is None:
            return
        unknown = [o for o in new if o.meta.key not in self._known]
        if not unknown:
            return
        on_disk = self._cold.present([o.meta.key for o in unknown])
        queued = 0
        for obj in unknown:
            if obj.meta.key not in on_disk:
                data = self._codec.encode(obj.payload, obj.tokens, obj.meta)
                self._cold.put(obj.meta, obj.tokens, data)
                queued += 1
            self._known.remember(obj.meta.key)
        if queued:
            self._tally.add(queued_blocks=queued)
