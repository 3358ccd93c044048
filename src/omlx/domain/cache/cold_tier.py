"""The cold tier (DESIGN §4): verified blocks from the store, write-through puts, batched recency.

A block is served only when the store found its file matching the index row's size
and checksum and its tokens rehash to its key (an ``external`` block, saved by the
library API under its caller's hash, has no tokens: its key must follow from that
hash, and its checksum is the check of its bytes); anything else is logged, counted,
removed (row, then file) and recomputed by the caller. A prefix's blocks are asked
for in one batch (``get_many``): one index query, then the store's ``read_many``, which
reads ahead as its medium suits while this thread decodes in order. Pure: how files
are read, hashed and timed out is the store adapter's business. Standard library only.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

from omlx.domain.cache import bulk_writes
from omlx.domain.cache.blocks import (
    BlockMeta,
    BlockRead,
    DecodedBlock,
    NamespaceInfo,
    ReadFailure,
    StoredBlock,
)
from omlx.domain.cache.keys import EXTERNAL, IMAGE, KV, rederives
from omlx.domain.cache.ports import BlockIndex, BlockSink, BlockStore, IndexUnavailable
from omlx.domain.cache.tally import Tally
from omlx.domain.ports import Clock, SystemClock

log = logging.getLogger(__name__)

# Candidates for token-granular matching asked of the index per lookup: the prefix cache
# reads at most a few of them, most recently used first.
CHILDREN_LIMIT = 16
# Keys of a chain asked of the index first; the rest is asked only when all of them are
# stored (``ColdTier._lookup_chain``): a new prompt costs one small query, not a long one.
CHAIN_HEAD = 16
# Children nearest the prompt in token order, asked on each side of it: the one sharing
# the longest run is among them however many siblings there are (block_heads, 0013).
NEAREST_LIMIT = 4


def _child(row: StoredBlock, tokens: tuple[int, ...] = ()) -> BlockMeta:
    """A KV child as the index lists it, with who computed it (kept in RAM if promoted)."""
    return BlockMeta(
        row.key,
        row.parent_key,
        row.namespace,
        row.token_count,
        tokens=tokens,
        computed_by=row.computed_by or "",
    )


class RecencyBuffer:
    """Hits kept in memory and written to the index in one batch (not one write per hit).

    ``record`` never writes unless ``max_pending`` keys pile up; the writer thread calls
    ``maybe_flush`` every few seconds and ``flush`` runs at shutdown, so LRU order survives.
    """

    def __init__(
        self,
        index: BlockIndex,
        clock: Clock | None = None,
        *,
        interval: float = 5.0,
        max_pending: int = 4096,
    ) -> None:
        self._index = index
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.interval = interval
        self._max_pending = max_pending
        self._hits: dict[str, float] = {}
        self._last_flush = self._clock.now()
        self._lock = threading.Lock()
        self._flushing = threading.Lock()

    def record(self, keys: Sequence[str]) -> None:
        now = self._clock.now()
        with self._lock:
            for key in keys:
                self._hits[key] = now
            full = len(self._hits) >= self._max_pending
        if full:
            self.flush()

    def pending(self) -> int:
        with self._lock:
            return len(self._hits)

    def maybe_flush(self) -> int:
        """Flush when ``interval`` seconds have passed since the last flush."""
        if self._clock.now() - self._last_flush < self.interval:
            return 0
        return self.flush()

    def flush(self) -> int:
        """Write every buffered hit; returns how many keys were written.

        One flush at a time: a caller's flush (shutdown, tests) returns only after a
        periodic one already writing on the writer thread has committed its batch.
        """
        with self._flushing:
            return self._flush()

    def _flush(self) -> int:
        with self._lock:
            batch, self._hits = self._hits, {}
            self._last_flush = self._clock.now()
        if not batch:
            return 0
        try:
            self._index.touch(batch)
        except Exception as exc:
            if isinstance(exc, IndexUnavailable):
                log.debug("recency flush of %d keys deferred: %s", len(batch), exc)
            else:
                log.exception("recency flush of %d keys failed; will retry", len(batch))
            # Recency is advisory: keep the hits for the next flush rather than fail a caller.
            with self._lock:
                for key, at in batch.items():
                    self._hits[key] = max(at, self._hits.get(key, at))
            return 0
        return len(batch)


@dataclass(frozen=True, slots=True)
class ColdTierStats:
    """Cumulative counters of one namespace's cold tier: reads served, missed and refused,
    blocks queued for the writer or dropped before it."""

    hits: int = 0
    misses: int = 0
    corrupt_blocks: int = 0
    missing_files: int = 0
    queued: int = 0
    dropped: int = 0


class ColdTier:
    """Implements ``ColdSource`` for one namespace over a block store, an index and a writer.

    ``drop_missing_rows``: the one server that owns its folder knows a missing file is
    gone, and drops the row. With a folder shared by several servers a file may be
    missing only to this host for a while (NFS caches negative lookups), so the row is
    left for reconcile and the read is just a miss.
    """

    def __init__(
        self,
        namespace: NamespaceInfo,
        store: BlockStore,
        index: BlockIndex,
        writer: BlockSink,
        decode: Callable[[bytes], DecodedBlock],
        clock: Clock | None = None,
        recency: RecencyBuffer | None = None,
        *,
        check: Callable[..., str | None],
        drop_missing_rows: bool = True,
    ) -> None:
        self.namespace = namespace
        self._store = store
        self._index = index
        self._writer = writer
        self._decode = decode
        self._check = check  # the codec's: does the file hold what this model computes
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.recency = recency if recency is not None else RecencyBuffer(index, self._clock)
        self.drop_missing_rows = drop_missing_rows
        self._tally = Tally()

    def stats(self) -> ColdTierStats:
        return self._tally.read_as(ColdTierStats)

    def get(
        self, key: str, parent_key: str, *, touch: bool = True
    ) -> tuple[tuple[int, ...], Any] | None:
        rows = self._lookup([key])
        row = None if rows is None else rows.get(key)
        if row is None or row.namespace != self.namespace.digest:
            self._tally.add(misses=1)
            return None
        with closing(self._store.read_many([row])) as reads:
            read = next(reads, None)
        return None if read is None else self._serve(read, parent_key, touch)

    def get_many(
        self,
        chain: Sequence[tuple[str, str]],
        *,
        touch: bool = True,
        rows: Mapping[str, StoredBlock] | None = None,
    ) -> Generator[tuple[tuple[int, ...], Any], None, None]:
        if not chain:
            return
        if rows is None:  # not already asked (``rows``) for this chain
            rows = self._lookup_chain([key for key, _ in chain])
        if rows is None:
            self._tally.add(misses=1)
            return
        found: list[tuple[StoredBlock, str]] = []
        for key, parent_key in chain:  # the chain ends at its first block without a row
            row = rows.get(key)
            if row is None or row.namespace != self.namespace.digest:
                break
            found.append((row, parent_key))
        if not found:
            self._tally.add(misses=1)
            return
        # Closing this generator closes the store's: files not yet read are not read.
        with closing(self._store.read_many([row for row, _ in found])) as reads:
            for (_, parent_key), read in zip(found, reads, strict=False):
                served = self._serve(read, parent_key, touch)
                if served is None:
                    return
                yield served
        if len(found) < len(chain):
            self._tally.add(misses=1)

    def read_object(self, key: str, kind: str) -> tuple[StoredBlock, bytes] | None:
        """The row and file bytes of this namespace's ``kind`` object ``key`` (one its
        caller decodes and checks itself: an image's rows), the file matching the row's
        size and checksum; None for no row or a file that cannot be served (a missing or
        mismatched one is dropped, as ``get`` drops a block's). Never raises."""
        rows = self._lookup([key])
        row = None if rows is None else rows.get(key)
        if row is None or row.namespace != self.namespace.digest or row.kind != kind:
            return None
        with closing(self._store.read_many([row])) as reads:
            read = next(reads, None)
        if read is None or read.data is None:
            failure = read.failure if read is not None else ReadFailure.UNREADABLE
            if failure is ReadFailure.MISSING and self.drop_missing_rows:
                self._drop(row, failure.value, "missing_files")
            elif failure is ReadFailure.MISMATCH:
                self._drop(row, failure.value, "corrupt_blocks")
            else:
                log.info("cold %s object %s: %s; a miss", kind, key, failure and failure.value)
            return None
        return row, read.data

    def rows(self, keys: Sequence[str]) -> dict[str, StoredBlock] | None:
        """The index rows of a chain's ``keys`` in this namespace (head first, as a lookup
        asks); None when the index did not answer."""
        rows = self._lookup_chain(list(keys))
        if rows is None:
            return None
        return {k: r for k, r in rows.items() if r.namespace == self.namespace.digest}

    def file_rows(self, keys: Sequence[str]) -> list[StoredBlock]:
        """The index rows of ``keys`` in this namespace, in order, to the first one missing."""
        rows = self._lookup(list(keys))
        found: list[StoredBlock] = []
        for key in keys:
            row = (rows or {}).get(key)
            if row is None or row.namespace != self.namespace.digest:
                break
            found.append(row)
        return found

    def read_files(self, rows: Sequence[StoredBlock]) -> Iterator[tuple[StoredBlock, bytes]]:
        """Each row's file bytes, one at a time, to the first file that is missing or does
        not match its row's size and checksum (an export's source: nothing is decoded,
        touched or dropped here)."""
        with closing(self._store.read_many(list(rows))) as reads:
            for read in reads:
                if read.data is None:
                    return
                yield read.block, read.data

    def close(self) -> None:
        """Stop the store's background reads (shutdown); a later batch read starts them again."""
        self._store.close()

    def put(self, meta: BlockMeta, tokens: Sequence[int], data: bytes) -> bool:
        meta = self._storable(meta, tokens)
        if meta is None:
            return True  # refused for good (logged): nothing to put again
        try:
            accepted = self._writer.submit(meta, self.namespace, data)
        except Exception:
            log.exception("queueing block %s failed; dropped", meta.key)
            accepted = False
        if accepted:
            self._tally.add(queued=1)
        else:
            self._tally.add(dropped=1)
        return accepted

    def has_room(self) -> bool:
        return self._writer.has_room()

    def write_all(self, blocks: Iterable[tuple[BlockMeta, Sequence[int], bytes]]) -> Counter[str]:
        """Write ``blocks``, waiting for room and for each write to end (an import: never a
        silent drop); how many ended each way (``bulk_writes.write_all``)."""
        refused = Counter[str]()

        def storable() -> Iterator[tuple[BlockMeta, bytes]]:
            for meta, tokens, data in blocks:
                checked = self._storable(meta, tokens)
                if checked is None:
                    refused["dropped_mismatch"] += 1
                    continue
                self._tally.add(queued=1)
                yield checked, data

        def submit(meta: BlockMeta, data: bytes, **how: Any) -> bool:
            return self._writer.submit(meta, self.namespace, data, **how)

        return bulk_writes.write_all(submit, storable()) + refused

    def _storable(self, meta: BlockMeta, tokens: Sequence[int]) -> BlockMeta | None:
        """``meta`` with its tokens, if it is a block of this namespace carrying them; else None."""
        # An external block covers token_count positions but carries none of the tokens;
        # an image rows object has a row per placeholder token and no tokens either.
        carried = 0 if meta.kind in (EXTERNAL, IMAGE) else meta.token_count
        if meta.namespace != self.namespace.digest or len(tokens) != carried:
            log.error("block %s does not match this namespace or its tokens; not stored", meta.key)
            self._tally.add(dropped=1)
            return None
        if meta.kind == KV and not meta.tokens:  # the index keeps them, to rank siblings
            meta = replace(meta, tokens=tuple(tokens))
        return meta

    def forget(self, keys: Sequence[str]) -> None:
        """Remove ``keys``' rows, then their files: a restore found them unusable."""
        rows = self._lookup(list(keys))
        found = [r for r in (rows or {}).values() if r.namespace == self.namespace.digest]
        if found:
            log.warning("removing %d cold blocks a restore could not use", len(found))
            self._remove(found, corrupt_blocks=len(found))

    def writing(self, key: str) -> bool:
        """Whether ``key``'s block is queued for (or in) a write that has not ended yet."""
        return self._writer.pending(key)

    def contains(self, key: str) -> bool:
        if self._writer.pending(key):
            return True
        rows = self._lookup([key])
        return rows is not None and key in rows

    def present(self, keys: Sequence[str]) -> set[str]:
        found = {k for k in keys if self._writer.pending(k)}
        asked = [k for k in keys if k not in found]
        if not asked:  # all queued: no index query
            return found
        rows = self._lookup(asked)
        if rows is None:
            return found
        return found | {k for k, r in rows.items() if r.namespace == self.namespace.digest}

    def point_children(self, parent_keys: Sequence[str]) -> list[BlockMeta]:
        try:
            rows = self._index.point_children(parent_keys)
        except IndexUnavailable as exc:
            log.debug("restore points under %d keys: index unavailable (%s)", len(parent_keys), exc)
            return []
        except Exception:
            log.exception("index lookup of restore points under %d keys failed", len(parent_keys))
            return []
        return [
            BlockMeta(r.key, r.parent_key, r.namespace, r.token_count, r.kind)
            for r in rows
            if r.namespace == self.namespace.digest
        ]

    def children(self, parent_key: str, want: Sequence[int] = ()) -> list[BlockMeta]:
        """KV children of ``parent_key``: with ``want``, those that could continue it best.

        The nearest in token order (their tokens known, so ranking them reads nothing) and
        the most recent of those recorded without tokens (ranked by reading them). Without
        ``want``, the most recently used.
        """
        try:
            near = self._index.nearest_children(parent_key, want, NEAREST_LIMIT) if want else []
            # A child with tokens that is not among the nearest cannot share a longer run;
            # listing it would cost a block read per lookup (the most recent conversations'
            # first blocks, read for every new prompt).
            recent = self._index.children(parent_key, CHILDREN_LIMIT, headless=bool(want))
        except IndexUnavailable as exc:
            log.debug("children of %s: index unavailable (%s)", parent_key, exc)
            return []
        except Exception:
            log.exception("index lookup of the children of %s failed", parent_key)
            return []
        ns = self.namespace.digest
        found = {
            r.key: _child(r, tokens)
            for r, tokens in near
            if r.namespace == ns and len(tokens) == r.token_count
        }
        for r in recent:
            if r.namespace == ns and r.key not in found:
                found[r.key] = _child(r)
        return list(found.values())

    def touch(self, keys: Sequence[str]) -> None:
        self.recency.record(keys)

    def flush(self) -> int:
        """Write buffered recency now (shutdown, tests)."""
        return self.recency.flush()

    def _lookup_chain(self, keys: list[str]) -> dict[str, StoredBlock] | None:
        """The rows of a chain's ``keys``: its head first, the rest only if the head is stored.

        A new prompt's chain is unknown from its first block: asking for 1,000 keys of a
        64k-token prompt costs ~4 ms at 1M rows (bench/index_scale.py), its head ~0.1 ms.
        """
        head = self._lookup(keys[:CHAIN_HEAD])
        if head is None or len(keys) <= CHAIN_HEAD or not all(k in head for k in keys[:CHAIN_HEAD]):
            return head
        rest = self._lookup(keys[CHAIN_HEAD:])
        return head if rest is None else head | rest

    def _lookup(self, keys: list[str]) -> dict[str, StoredBlock] | None:
        """The index rows of ``keys``; None when the index failed (a miss, never an error)."""
        try:
            return self._index.get_blocks(keys)
        except IndexUnavailable as exc:
            log.debug("index lookup of %d keys: unavailable (%s); a miss", len(keys), exc)
        except Exception:
            log.exception("index lookup of %d keys failed; treated as a miss", len(keys))
        return None

    def _serve(
        self, read: BlockRead, parent_key: str, touch: bool = True
    ) -> tuple[tuple[int, ...], Any] | None:
        """Decode a verified read and serve it, or count and handle why it cannot be."""
        row = read.block
        if read.failure is ReadFailure.MISSING:
            if self.drop_missing_rows:
                self._drop(row, read.failure.value, "missing_files")
            else:
                log.info(
                    "cold block %s: %s here; a miss, its row is left", row.key, read.failure.value
                )
                self._tally.add(missing_files=1, misses=1)
            return None
        if read.failure is ReadFailure.UNAVAILABLE:
            log.debug("cold block %s: %s (%s); a miss", row.key, read.failure.value, read.detail)
            self._tally.add(misses=1)
            return None
        if read.failure in (ReadFailure.UNREADABLE, ReadFailure.TIMED_OUT):
            log.error("cold block %s: %s (%s); a miss", row.key, read.failure.value, read.detail)
            self._tally.add(misses=1)
            return None
        decoded, problem = self._verify(read, parent_key)
        if decoded is None:
            self._drop(row, problem, "corrupt_blocks")
            return None
        if touch:  # a no-store request's reads leave the index as it was
            self.recency.record((row.key,))
        self._tally.add(hits=1)
        return decoded.tokens, decoded.payload

    def _verify(self, read: BlockRead, parent_key: str) -> tuple[DecodedBlock | None, str]:
        row = read.block
        if read.failure is not None or read.data is None:
            failure = read.failure or ReadFailure.MISMATCH
            return None, failure.value + (f" ({read.detail})" if read.detail else "")
        meta = BlockMeta(row.key, parent_key, row.namespace, row.token_count, row.kind)
        # A read's file was written by this server or checked whole at import: its shapes
        # and ids are checked again (its header), its values are not rescanned (a scan of
        # every byte would add a fifth to a restore's read time).
        return self.verify(read.data, meta, values=False)

    def verify(
        self, data: bytes, meta: BlockMeta, *, values: bool = True
    ) -> tuple[DecodedBlock | None, str]:
        """``data`` decoded if it is the object ``meta`` names (``meta.parent_key``: what its
        key derives from) and holds what this model computes (the codec's ``check``; with
        ``values``, finite floats too), else None and what is wrong; never raises. Every
        read is checked this way, and an imported block, values and all, before it is
        written."""
        try:
            decoded = self._decode(data)
        except Exception as exc:  # a codec bug on a bad file must not fail the request
            return None, f"it cannot be decoded ({exc})"
        # First what the model computes (token ids in its vocabulary, its shapes), so a
        # refusal names the fault rather than a key that cannot be derived from it.
        try:
            problem = self._check(data, meta, values=values)
        except Exception as exc:  # a checker bug on a bad file must not fail the request
            problem = f"it cannot be checked ({exc})"
        if problem is not None:
            return None, problem
        # A restore point's object is named by its kind and the key of the tokens up to it;
        # an external block by its namespace and its caller's hash.
        if not rederives(meta.kind, meta.key, meta.parent_key, decoded.tokens, meta.namespace):
            if meta.kind == EXTERNAL:
                return None, "its key does not follow from its caller's hash"
            return None, "its tokens do not rehash to its key"
        if decoded.metadata.get("kind", KV) != meta.kind:
            return (
                None,
                f"its file holds a {decoded.metadata.get('kind')!r} object, the row a {meta.kind!r}",
            )
        if decoded.metadata.get("key", meta.key) != meta.key:
            return None, "its metadata names another key"
        if decoded.metadata.get("namespace", meta.namespace) != meta.namespace:
            return None, "its metadata names another namespace"
        if meta.kind == EXTERNAL and decoded.metadata.get("parent_key") != meta.parent_key:
            return None, "its metadata names another caller's hash"
        return decoded, ""

    def _drop(self, row: StoredBlock, problem: str, counter: str) -> None:
        log.warning(
            "cold block %s (%s) is not served: %s; removing it", row.key, row.relpath, problem
        )
        self._remove([row], **{counter: 1}, misses=1)

    def _remove(self, rows: Sequence[StoredBlock], **counts: int) -> None:
        """Rows first, files second; counted. A failure is left to reconcile, never raised."""
        self._tally.add(**counts)
        try:
            self._index.remove_blocks([r.key for r in rows])
            for row in rows:
                self._store.delete(row.relpath)
        except Exception as exc:
            log.warning("removing %d bad blocks failed (%s); reconcile will", len(rows), exc)
