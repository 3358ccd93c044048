"""The block cache's ports (DESIGN §3): what its tiers need of storage, an index and an engine's
KV tensors. The adapters implement them; the cache sees only these."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from omlx.domain.cache.blocks import (
    BlockMeta,
    BlockRead,
    DecodedBlock,
    HotSet,
    ImageInfo,
    NamespaceInfo,
    NamespaceUsage,
    StoredBlock,
)

# Chooses eviction victims: (bytes indexed now, candidates oldest first) -> the victims.
EvictionPlan = Callable[[int, Iterable[StoredBlock]], list[StoredBlock]]


class IndexUnavailable(Exception):
    """The index cannot be reached right now (its database is down or too slow).

    Callers treat it as a miss or a dropped write and log one line, no traceback:
    the adapter has already said why, once.
    """


class KVCodec(Protocol):
    """Engine-specific cutting and joining of KV caches; every call runs on the engine thread.

    A *payload* is the codec's own per-block object (for MLX: materialized arrays);
    the domain only stores it, measures it and hands it back.
    """

    def split(self, cache: Any, start: int, stop: int) -> Any:
        """The payload of token positions ``[start, stop)`` of ``cache`` (one block), materialized."""
        ...

    def assemble(
        self, payloads: Sequence[Any], windows: Sequence[Any] = (), state: Any = None, room: int = 0
    ) -> Any:
        """A fresh engine cache holding ``payloads`` in order, its offset at their total length.

        Hybrid layouts also get the restore point's ``windows`` (the window objects of the
        positions before it, in order) and ``state`` (its state snapshot). ``room``: how
        many positions the caller will append next (the prompt's uncached tail), which the
        cache may set aside now rather than grow into.
        """
        ...

    def split_window(self, cache: Any, start: int, stop: int) -> Any:
        """The sliding-window layers' KV of positions ``[start, stop)``, materialized."""
        ...

    def snapshot(self, cache: Any) -> Any:
        """The recurrent layers' state after the cache's last position, materialized."""
        ...

    def truncate(self, payload: Any, n: int) -> Any:
        """The payload of the block's first ``n`` positions (``0 < n <= its length``).

        Token-granular matching uses a stored block whose leading tokens equal the prompt's.
        """
        ...

    def nbytes(self, payload: Any) -> int: ...

    def encode(self, payload: Any, tokens: Sequence[int], meta: BlockMeta) -> bytes:
        """The block file's bytes (the store's format is the codec's business), ready for the writer thread."""
        ...

    def decode(self, data: bytes) -> DecodedBlock:
        """Parse a block file's bytes; raises ``ValueError`` on a malformed file."""
        ...

    def check(self, data: bytes, meta: BlockMeta, *, values: bool = True) -> str | None:
        """Why the object file ``data`` (``decode`` parses it) is not one this model computes,
        as a sentence, or None: its layers, shapes and dtypes, its token count (1 to the
        block size) and ids (in the vocabulary), and with ``values`` its floats finite (a
        scan of every byte). Never raises."""
        ...


class KeptCaches(Protocol):
    """Finished requests' engine caches, kept whole for the next turn of their conversation.

    An agent's next turn extends its previous prompt and reply; continuing the finished
    cache in place spares copying its prefix out of the hot tier's blocks. Engine thread only.
    """

    @property
    def nbytes(self) -> int:
        """Bytes the kept caches hold (beside the hot tier's copies of their blocks)."""
        ...

    def take(self, prompt: Sequence[int], prefix: int) -> Any | None:
        """A cache holding exactly ``prompt[:prefix]``, cut from a kept one; None when none holds it."""
        ...

    def held_for(self, prefix: Sequence[int]) -> int:
        """Bytes of the kept cache ``take`` would hand over whole for ``prefix`` (they become
        that request's own cache); 0 when none would (none holds it, or it lends a view)."""
        ...

    def shrink(self, max_bytes: int, spare: Sequence[int] = ()) -> None:
        """Forget kept caches, oldest first, until the others hold at most ``max_bytes``;
        the one ``held_for(spare)`` counts stays (its request is about to take it)."""
        ...

    def keep(self, tokens: Sequence[int], cache: Any) -> None:
        """Keep a finished request's cache, which holds exactly ``tokens``; may decline it."""
        ...

    def fits(self, nbytes: int) -> bool:
        """Whether a cache of ``nbytes`` would be kept (keeping on, within its budget)."""
        ...

    def clear(self) -> None:
        """Forget every kept cache (memory is wanted, or the engine was reset)."""
        ...


class BlockStore(Protocol):
    """Block files addressed by '/'-separated relative paths; may be shared by several servers."""

    def relpath(self, namespace: NamespaceInfo, key: str, checksum: str) -> str:
        """Where the block file with these bytes (hex SHA-256 ``checksum``) lives.

        Content-addressed: two writers' different bytes for one key never share a file.
        """
        ...

    def write(self, relpath: str, data: bytes) -> None:
        """Durably write (temp file, fsync, rename, fsync folder); raises ``OSError`` (ENOSPC)."""
        ...

    def read(self, relpath: str) -> bytes:
        """Raises ``FileNotFoundError`` when the file is gone."""
        ...

    def read_many(self, blocks: Sequence[StoredBlock]) -> Generator[BlockRead, None, None]:
        """Each block's file, in order, checked against its row's size and checksum; never raises.

        Files are read ahead of the caller as the medium suits (threads for a disk), within
        a time budget, so a hung share turns into misses. ``close()`` the generator to stop
        early: files not yet read are then not read.
        """
        ...

    def close(self) -> None:
        """Stop background reads (shutdown); a later ``read_many`` starts them again."""
        ...

    def delete(self, relpath: str) -> None:
        """Remove the file; a missing file is not an error."""
        ...

    def iter_relpaths(self) -> Iterator[str]:
        """Every complete block file on disk (temporary files excluded)."""
        ...

    def remove_temp_files(self, older_than: float | None = None) -> int:
        """Delete leftover temporary files (older than ``older_than`` seconds); returns the count."""
        ...


class ByteBudget(Protocol):
    """How many bytes of blocks the cold tier may hold now (a size cap, a disk's free space)."""

    def limit(self, used: int) -> int:
        """The limit, given ``used`` bytes of blocks stored already (evicting them frees space)."""
        ...


class BlockIndex(Protocol):
    """The transactional index of cold blocks (SQLite embedded, or PostgreSQL shared by servers).

    Any method may raise ``IndexUnavailable`` when the database cannot be reached.
    """

    def upsert_namespace(self, namespace: NamespaceInfo) -> None: ...

    def add_block(
        self, block: StoredBlock, tokens: Sequence[int] = (), image: ImageInfo | None = None
    ) -> bool:
        """Record a block whose file is complete (and a KV block's ``tokens``, an image rows
        object's ``image``, in the same transaction); True if recorded.

        False, and nothing changed, when the key has a row already: the first writer wins,
        and a later one deletes its own file unless the row names that very file.
        """
        ...

    def get_blocks(self, keys: Sequence[str]) -> dict[str, StoredBlock]: ...

    def children(self, parent_key: str, limit: int, headless: bool = False) -> list[StoredBlock]:
        """Up to ``limit`` KV blocks whose parent is ``parent_key``, most recently used first.

        ``headless``: of those, only the ones recorded without their tokens (which
        ``nearest_children`` cannot rank)."""
        ...

    def nearest_children(
        self, parent_key: str, tokens: Sequence[int], limit: int
    ) -> list[tuple[StoredBlock, tuple[int, ...]]]:
        """KV children of ``parent_key`` whose tokens sort nearest ``tokens`` (up to ``limit``
        on each side), with their tokens; blocks recorded without tokens are not listed."""
        ...

    def point_children(self, parent_keys: Sequence[str]) -> list[StoredBlock]:
        """Every restore-point object (kind state or window) whose parent is in ``parent_keys``."""
        ...

    def touch(self, hits: Mapping[str, float]) -> None:
        """Apply a batch of hits: key -> last access time; each hit adds one to ``hit_count``."""
        ...

    def remove_blocks(self, keys: Sequence[str]) -> None: ...

    def total_bytes(self) -> int: ...

    def lru_blocks(self, limit: int) -> list[StoredBlock]:
        """Up to ``limit`` blocks, least recently used first."""
        ...

    def evict(self, plan: EvictionPlan, accessed_before: float | None) -> list[StoredBlock] | None:
        """One transaction: ``plan`` picks victims, their rows go, and they are returned.

        ``plan`` sees the bytes indexed now and the blocks last used before
        ``accessed_before`` (None: all), oldest first, lazily, skipping rows another
        transaction holds. None, removing nothing, while another server is evicting.
        The caller deletes the files after this returns: rows first, files second.
        """
        ...

    def usage(self) -> list[NamespaceUsage]: ...

    def all_relpaths(self) -> set[str]: ...


class EvictionPolicy(Protocol):
    """Which RAM blocks go first when a tier is over budget; the tier owns the blocks."""

    def record_insert(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """Note a new block ``key`` (``nbytes`` large) extending ``parent_key``."""
        ...

    def record_hit(self, key: str, nbytes: int) -> None:
        """Note that a later request matched ``key``: it is being reused."""
        ...

    def record_promotion(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """Note ``key`` back in RAM from disk because a request matched it."""
        ...

    def record_access(self, key: str, nbytes: int) -> None:
        """Note another use of ``key`` (recency only: not a new block, not a match)."""
        ...

    def record_prefetch(self, key: str, nbytes: int, parent_key: str | None) -> None:
        """Note ``key`` read back at start ahead of any request (warm restart): it goes
        before every block a request used."""
        ...

    def remove(self, key: str) -> None:
        """Forget ``key``; an unknown key is not an error."""
        ...

    def choose_victims(self, bytes_to_free: int, is_pinned: Callable[[str], bool]) -> list[str]:
        """Unpinned keys, first to go first, until their bytes reach ``bytes_to_free``.

        Returns every unpinned key when they do not add up to that much; removes nothing.
        """
        ...

    def promotion_victims(
        self, key: str, bytes_to_free: int, is_pinned: Callable[[str], bool]
    ) -> list[str] | None:
        """``choose_victims`` for ``key``, read back from disk for a request, to enter RAM;
        None: leave RAM as it is (the request uses what it read). Removes nothing."""
        ...


class ColdSource(Protocol):
    """The cold tier as the prefix cache sees it; called on the engine thread, never blocks on a write."""

    def get(
        self, key: str, parent_key: str, *, touch: bool = True
    ) -> tuple[tuple[int, ...], Any] | None:
        """The block's tokens and payload once they rehash to ``key`` from ``parent_key``.

        A served block counts as a hit in the cold tier's recency unless ``touch`` is
        False (a no-store request leaves the index as it was). ``None`` for a missing,
        unreadable or corrupt block (which the tier drops): never raises.
        """
        ...

    def get_many(
        self,
        chain: Sequence[tuple[str, str]],
        *,
        touch: bool = True,
        rows: Mapping[str, StoredBlock] | None = None,
    ) -> Generator[tuple[tuple[int, ...], Any], None, None]:
        """``get`` of each ``(key, parent_key)`` of ``chain`` in order, up to the first ``None``.

        For a prefix's remaining blocks: one index query (none when ``rows``, the chain's
        rows as ``rows`` answered them, is given), and the store's batched read
        (``BlockStore.read_many``: read ahead and checksummed as its medium suits) while
        the caller's thread decodes them in order (the payload is made there). Stops at
        the first missing, unreadable, late or corrupt block (corrupt ones are dropped,
        as ``get`` does); ``close()`` it to stop early.
        """
        ...

    def verify(
        self, data: bytes, meta: BlockMeta, *, values: bool = True
    ) -> tuple[DecodedBlock | None, str]:
        """``data`` decoded if it is the object ``meta`` names, else None and what is wrong
        (the checks every read gets; an import's blocks get them, ``values`` included,
        before they are written)."""
        ...

    def rows(self, keys: Sequence[str]) -> dict[str, StoredBlock] | None:
        """The index rows of a chain's ``keys`` in this namespace, asked as ``get_many``
        asks (its head first); None when the index did not answer."""
        ...

    def put(self, meta: BlockMeta, tokens: Sequence[int], data: bytes) -> bool:
        """Queue the block file's bytes for the writer; never raises. False when the writer
        took nothing (a full queue, or stopping): the block may be put again. A block that is
        not this namespace's is refused for good (logged; True: nothing to put again)."""
        ...

    def has_room(self) -> bool:
        """Whether the writer's queue takes a block now (a ``put`` would not be turned away)."""
        ...

    def contains(self, key: str) -> bool:
        """Whether the key is on disk or already queued for it."""
        ...

    def forget(self, keys: Sequence[str]) -> None:
        """Remove ``keys``' rows, then their files (blocks a restore found unusable); never raises."""
        ...

    def file_rows(self, keys: Sequence[str]) -> list[StoredBlock]:
        """The rows of ``keys`` in this namespace, in order, to the first one missing."""
        ...

    def read_files(self, rows: Sequence[StoredBlock]) -> Iterator[tuple[StoredBlock, bytes]]:
        """Each row's file bytes, one at a time, to the first missing or mismatched file (an
        export's source: nothing is decoded, touched or dropped)."""
        ...

    def present(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are on disk or queued for it: one index query; never raises."""
        ...

    def point_children(self, parent_keys: Sequence[str]) -> list[BlockMeta]:
        """Restore-point objects (state, window) on disk hanging from any of ``parent_keys``.

        One index query; never raises.
        """
        ...

    def children(self, parent_key: str, want: Sequence[int] = ()) -> list[BlockMeta]:
        """Blocks on disk (full or partial) whose parent is ``parent_key``; never raises.

        Only metadata: those nearest ``want`` carry their tokens from the index (to rank
        them), the most recently used may not; a candidate's payload is read, and
        verified, by ``get``.
        """
        ...

    def touch(self, keys: Sequence[str]) -> None:
        """Hits served from RAM, so the cold tier's LRU sees them too (batch the writes)."""
        ...


class BlockSink(Protocol):
    """The cold tier's write queue (the block writer): bytes in, a file and an index row later."""

    def submit(
        self,
        meta: BlockMeta,
        namespace: NamespaceInfo,
        data: bytes,
        *,
        wait: float = 0.0,
        done: Callable[[str], None] | None = None,
    ) -> bool:
        """Queue one block file's bytes; False when the write was dropped (queue full, closed).

        ``wait``: seconds to wait for room in a full queue (an import's back-pressure; the
        engine's write-through never waits). ``done``: called once with the write's outcome
        (a ``WriteOutcome`` value or a ``WriterStats`` drop counter's name) when it ends, and
        not at all when ``submit`` returns False.
        """
        ...

    def pending(self, key: str) -> bool:
        """Whether ``key`` is queued but not yet on disk and in the index."""
        ...

    def has_room(self) -> bool:
        """Whether a ``submit`` now would be queued (room in the queue, or a stop's wait for it)."""
        ...


class HotSetStore(Protocol):
    """Where one namespace's hot set is kept between runs (warm restart)."""

    def load(self) -> HotSet | None:
        """The hot set last saved; None when there is none or it cannot be read (logged)."""
        ...

    def save(self, hot_set: HotSet) -> None:
        """Replace the saved hot set at once: a crash leaves the old one or the new one."""
        ...
