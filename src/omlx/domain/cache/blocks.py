"""Domain values of the block cache: namespaces, block metadata, index rows, prefix hits."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """One model identity whose blocks are interchangeable (DESIGN §4)."""

    digest: str
    model_name: str
    model_path: str
    block_size: int
    kv_dtype: str
    layer_count: int
    # What its object files hold (tensors, dtypes, shapes, block and vocabulary size), as
    # JSON the codec's adapter writes and reads: kept in the index so a block file can be
    # checked without the model (``omlx admin cache verify``). "" where none is known.
    block_spec: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the index keeps of an image rows object beside its block row (``images``)."""

    digest: str  # the image's SHA-256 (``domain.images.image_digest``)
    tenant: str  # the API key's tenant whose rows they are ("": the default one)
    rows: int  # the image's placeholder tokens: one row each
    hidden: int  # the language model's embedding size
    dtype: str  # the rows' dtype as the file stores it (safetensors spelling)


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """What the engine knows of a stored object (a block, or a restore point's) when it is cut.

    For a ``kv`` block, ``key`` is its block key. For a ``window`` or ``state`` object,
    ``key`` is ``object_key(kind, anchor)``, where the anchor is the block key of
    ``parent_key`` and its ``token_count`` tokens (the tokens up to the restore point).
    """

    key: str
    parent_key: str  # the namespace digest for the first block of a prompt
    namespace: str
    token_count: int
    kind: str = "kv"
    # A KV block's tokens where they are known without reading its file: set when it is
    # stored (the index keeps them beside its row) and when the index lists it as a child.
    tokens: tuple[int, ...] = ()
    # An ``image`` object's image: kept in the index's ``images`` table beside its row.
    image: ImageInfo | None = None
    # The server that computed it (its ``server_id``), carried into its index row and, for a
    # block read back, from that row: which server's work a restore used. "": not known.
    computed_by: str = ""


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """An index row: a block whose file is complete and fsynced."""

    key: str
    namespace: str
    parent_key: str
    token_count: int
    nbytes: int
    checksum: str  # hex SHA-256 of the whole file
    relpath: str  # relative to the cache folder, '/'-separated
    created_at: float
    last_access: float
    hit_count: int = 0
    kind: str = "kv"
    computed_by: str | None = None  # the writing server's id; None: written before it was kept


@dataclass(frozen=True, slots=True)
class NamespaceUsage:
    """One row of the ``cache_usage`` view."""

    namespace: str
    model_name: str
    blocks: int
    nbytes: int
    tokens: int
    oldest_access: float | None
    newest_access: float | None
    image_objects: int = 0  # of ``blocks``: image rows objects (a VLM's encoder output)
    image_bytes: int = 0


@dataclass(frozen=True, slots=True)
class DecodedBlock:
    """A block file's content as the codec reads it back."""

    tokens: tuple[int, ...]
    payload: object
    metadata: dict[str, str]


class ReadFailure(Enum):
    """Why a block store could not hand back a block file's verified bytes."""

    MISSING = "its file is missing"
    MISMATCH = "its size or checksum does not match the index"
    UNREADABLE = "its file could not be read"
    TIMED_OUT = "reading it took longer than the batch's time budget"
    # The store could not be asked (an object store down, slow or throttling); the store
    # has logged the fault once for its whole episode, so the tier does not again.
    UNAVAILABLE = "its store cannot be reached"


@dataclass(frozen=True, slots=True)
class BlockRead:
    """One block file as the store read it for ``block``: ``data`` only when it matched the row."""

    block: StoredBlock
    data: bytes | None
    failure: ReadFailure | None = None
    detail: str = ""  # the OS error or the sizes, for the log line


@dataclass(frozen=True, slots=True, eq=False)
class PrefixHit:
    """The matched prefix of one prompt, pinned until its lease is released.

    ``keys``/``payloads``: the whole blocks matched by key, then, when ``partial_tokens``
    is non-zero, the block whose first ``partial_tokens`` positions continue them (its
    payload already truncated). ``hot_hits``/``cold_hits`` count whole blocks only.
    """

    keys: tuple[str, ...] = ()
    payloads: tuple[Any, ...] = ()
    cached_tokens: int = 0
    hot_hits: int = 0
    cold_hits: int = 0
    lease: int = 0  # 0: nothing pinned
    partial_tokens: int = 0
    # Hybrid and sliding-window layouts: the restore point's window objects (in position
    # order) and state snapshot, and how far the KV chain reached before it.
    windows: tuple[Any, ...] = ()
    state: Any = None
    matched: int = 0
    partial_from_disk: bool = False  # the partial block was read from the cold tier
    # What the lookup saw where the prompt leaves the cache (at ``matched``), for the
    # request's report: the tokens a stored block holds there instead (empty: the chain
    # ends), the server that computed the deepest restored block, and whether the prompt's
    # next block was stored once (this process queued or read it) and is held no longer.
    stored_next: tuple[int, ...] = ()
    computed_by: str = ""
    evicted: bool = False

    @property
    def lost_tokens(self) -> int:
        """Positions the KV chain matched past the deepest restore point (recomputed)."""
        return max(self.matched - self.cached_tokens, 0)

    @property
    def n_blocks(self) -> int:
        """Whole blocks matched by key (the partially used block not counted)."""
        return len(self.keys) - (1 if self.partial_tokens else 0)


MISS = PrefixHit()  # nothing matched, nothing pinned


@dataclass(frozen=True, slots=True)
class PromptChain:
    """A prompt's chain keys and what the index said of them when it was probed.

    ``keys``: the keys of the whole blocks a lookup may restore, from ``root``. ``rows``:
    the index rows found for ``keys[asked_from:]`` (those past RAM's run at the time),
    None when the index was not asked or did not answer. ``asked_at``: the clock's seconds.
    ``children``: the stored children of ``children_of`` (where the whole blocks ended),
    as the index listed them to continue the prompt. A lookup soon after reuses all of it
    instead of hashing the prompt and asking again.
    """

    root: str
    keys: tuple[str, ...]
    rows: dict[str, StoredBlock] | None = None
    asked_from: int = 0
    asked_at: float = 0.0
    children_of: str | None = None
    children: tuple[BlockMeta, ...] = ()


HOT, SSD, NONE = "hot", "ssd", "none"


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """The longest prefix of a prompt the cache holds, and what it holds past it."""

    tokens: int  # prompt positions a request would restore (one is always left to prefill)
    prompt_tokens: int
    hot_tokens: int = 0  # of ``tokens``, held in RAM
    ssd_tokens: int = 0  # of ``tokens``, held only on disk
    # Where a stored block goes on past the divergence: its next tokens (RAM blocks only).
    stored_next: tuple[int, ...] = ()
    # What was hashed and asked of the index to find it: the request's lookup reuses it.
    chain: PromptChain | None = None
    # The server that computed the deepest block of ``tokens`` ("": nothing held, or a
    # block whose row predates the record of it).
    computed_by: str = ""
    # Where the prompt leaves the stored chain: ``tokens`` but for hybrid and sliding-window
    # layouts, whose restore stops at the deepest restore point before it.
    matched: int = 0
    # The prompt's next block past ``matched`` was stored once and is held no longer.
    evicted: bool = False
    # Set by the engine when it restored the prefix: positions past ``tokens`` that a
    # running request was computing for a prompt sharing them (a prefix in flight), and
    # whether this request waited for such a request's prefill first.
    in_flight: int = 0
    waited: bool = False

    @property
    def tier(self) -> str:
        """``ssd`` when any restored token must be read from disk, else ``hot``; ``none``: a miss."""
        if not self.tokens:
            return NONE
        return SSD if self.ssd_tokens else HOT

    @property
    def full_hit(self) -> bool:
        """Everything but the one token always prefilled is cached."""
        return self.prompt_tokens > 0 and self.tokens >= self.prompt_tokens - 1

    @property
    def diverged_at(self) -> int:
        """The prompt token where it leaves what the cache holds."""
        return max(self.tokens, self.matched)


@dataclass(frozen=True, slots=True)
class HotSetEntry:
    """One object of a hot set (warm restart, ``hot_set``) to read back: its key and what
    its read is checked against."""

    key: str
    parent_key: str
    kind: str
    token_count: int
    nbytes: int  # its size in RAM, to stop at the hot tier's budget before reading


@dataclass(frozen=True, slots=True)
class HotSet:
    """A namespace's hot set as recorded at ``recorded_at`` (seconds since the epoch)."""

    namespace: str
    recorded_at: float
    entries: tuple[HotSetEntry, ...]

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)
