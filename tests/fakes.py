"""In-memory fakes of the domain's ports, one ``Fake<Port>`` per port, grouped by port.

The fake engine cache is a plain list of ints, one per token position.
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from omlx.domain.cache.blocks import (
    BlockMeta,
    BlockRead,
    DecodedBlock,
    ImageInfo,
    NamespaceInfo,
    NamespaceUsage,
    ReadFailure,
    StoredBlock,
)
from omlx.domain.cache.hot_set import HotSet
from omlx.domain.cache.keys import block_key, object_key
from omlx.domain.cache.ports import EvictionPlan, IndexUnavailable

# --- Clock -------------------------------------------------------------------------


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float = 1.0) -> float:
        self.t += seconds
        return self.t


# --- KVCodec -----------------------------------------------------------------------


class FakeCodec:
    """A codec over list caches: a payload is the tuple of a block's positions."""

    def __init__(self) -> None:
        self.splits = 0
        self.encodes = 0
        self.refused: dict[str, str] = {}  # key -> why ``check`` refuses its file

    def split(self, cache: list[int], start: int, stop: int) -> tuple[int, ...]:
        if not 0 <= start < stop <= len(cache):
            raise ValueError(f"split [{start}, {stop}) outside a cache of {len(cache)}")
        self.splits += 1
        return tuple(cache[start:stop])

    def assemble(
        self, payloads: Sequence[tuple[int, ...]], windows=(), state=None, room=0
    ) -> list[int]:
        return [v for p in payloads for v in p]

    def split_window(self, cache: list[int], start: int, stop: int) -> tuple[int, ...]:
        return ("window", *self.split(cache, start, stop))

    def snapshot(self, cache: list[int]) -> tuple[int, ...]:
        return ("state", len(cache), sum(cache))

    def truncate(self, payload: tuple[int, ...], n: int) -> tuple[int, ...]:
        if not 0 < n <= len(payload):
            raise ValueError(f"cannot keep {n} of a block's {len(payload)} positions")
        return payload[:n]

    def nbytes(self, payload: tuple[int, ...]) -> int:
        return 8 * len(payload)

    def encode(self, payload: tuple[int, ...], tokens: Sequence[int], meta: BlockMeta) -> bytes:
        self.encodes += 1
        doc = {"tokens": list(tokens), "payload": list(payload), "meta": asdict(meta)}
        return json.dumps(doc, sort_keys=True).encode()

    def decode(self, data: bytes) -> DecodedBlock:
        try:
            doc = json.loads(data)
            meta = {k: str(v) for k, v in doc["meta"].items()}
            return DecodedBlock(tuple(doc["tokens"]), tuple(doc["payload"]), meta)
        except (KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ValueError(f"malformed fake block: {exc}") from exc

    def check(self, data: bytes, meta: BlockMeta, *, values: bool = True) -> str | None:
        """A KV file whose payload is not as long as its tokens, or a key in ``refused``."""
        if meta.key in self.refused:
            return self.refused[meta.key]
        try:
            block = self.decode(data)
        except ValueError as exc:
            return str(exc)
        if meta.kind == "kv" and len(block.payload) != len(block.tokens):
            return f"its KV covers {len(block.payload)} positions for {len(block.tokens)} tokens"
        return None


# --- BlockStore --------------------------------------------------------------------


class FakeBlockStore:
    """Block files in a dict; set ``fail_writes`` to an ``OSError`` to simulate a full disk,
    ``fail_deletes`` to one to simulate a folder that turned read-only.

    ``read_many`` verifies size and checksum as the real store does; ``unreadable`` holds
    relpaths whose reads fail with an I/O error, ``slow`` those whose reads time out.
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.temp_files: dict[str, float] = {}  # relpath -> age in seconds
        self.fail_writes: OSError | None = None
        self.fail_deletes: OSError | None = None
        self.unreadable: set[str] = set()
        self.slow: set[str] = set()
        self.reads: list[str] = []
        self.closed = 0

    def relpath(self, namespace: NamespaceInfo, key: str, checksum: str) -> str:
        model = namespace.model_name.replace("/", "_")
        return f"{model}-{namespace.digest[:12]}/{key[:2]}/{key}.{checksum[:12]}.safetensors"

    def write(self, relpath: str, data: bytes) -> None:
        if self.fail_writes is not None:
            raise self.fail_writes
        self.files[relpath] = bytes(data)

    def read(self, relpath: str) -> bytes:
        try:
            return self.files[relpath]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such block file", relpath) from None

    def read_many(self, blocks: Sequence[StoredBlock]) -> Generator[BlockRead, None, None]:
        """Lazily, one file per block as the caller asks for it (no read-ahead)."""
        for block in blocks:
            self.reads.append(block.relpath)
            if block.relpath in self.slow:
                yield BlockRead(block, None, ReadFailure.TIMED_OUT, "fake budget")
                return
            if block.relpath in self.unreadable:
                yield BlockRead(block, None, ReadFailure.UNREADABLE, "EIO")
                continue
            data = self.files.get(block.relpath)
            if data is None:
                yield BlockRead(block, None, ReadFailure.MISSING)
            elif len(data) != block.nbytes or hashlib.sha256(data).hexdigest() != block.checksum:
                yield BlockRead(block, None, ReadFailure.MISMATCH, "fake mismatch")
            else:
                yield BlockRead(block, data)

    def delete(self, relpath: str) -> None:
        if self.fail_deletes is not None:
            raise self.fail_deletes
        self.files.pop(relpath, None)

    def iter_relpaths(self) -> Iterator[str]:
        return iter(list(self.files))

    def remove_temp_files(self, older_than: float | None = None) -> int:
        doomed = [p for p, age in self.temp_files.items() if older_than is None or age > older_than]
        for p in doomed:
            del self.temp_files[p]
        return len(doomed)

    def close(self) -> None:
        self.closed += 1


# --- BlockIndex --------------------------------------------------------------------


class FakeBlockIndex:
    """The block index in dicts, with the same ordering rules as the SQL one.

    A block's namespace must be recorded first, as the SQL index's foreign key requires
    (an admin's cache clear drops namespace rows: ``namespaces.clear()``). Set ``down`` to make every call raise ``IndexUnavailable`` (a database outage);
    set ``evicting_elsewhere`` to make ``evict`` report another server evicting.
    """

    def __init__(self) -> None:
        self.namespaces: dict[str, NamespaceInfo] = {}
        self.blocks: dict[str, StoredBlock] = {}
        self.heads: dict[str, tuple[int, ...]] = {}
        self.images: dict[str, ImageInfo] = {}  # the ``images`` table, by block key
        self.down = False
        self.evicting_elsewhere = False
        self.lookups = 0
        self.listings = 0  # children and nearest_children queries

    def _check(self) -> None:
        if self.down:
            raise IndexUnavailable("fake index down")

    def upsert_namespace(self, namespace: NamespaceInfo) -> None:
        self._check()
        self.namespaces[namespace.digest] = namespace

    def add_block(
        self, block: StoredBlock, tokens: Sequence[int] = (), image: ImageInfo | None = None
    ) -> bool:
        self._check()
        if block.namespace not in self.namespaces:
            raise LookupError(f"foreign key: no namespace {block.namespace[:12]}")
        if block.key in self.blocks:
            return False
        self.blocks[block.key] = block
        if tokens:
            self.heads[block.key] = tuple(tokens)
        if image is not None:
            self.images[block.key] = image
        return True

    def get_blocks(self, keys: Sequence[str]) -> dict[str, StoredBlock]:
        self._check()
        self.lookups += 1
        return {k: self.blocks[k] for k in keys if k in self.blocks}

    def children(self, parent_key: str, limit: int, headless: bool = False) -> list[StoredBlock]:
        self._check()
        self.listings += 1
        mine = [b for b in self.blocks.values() if b.parent_key == parent_key and b.kind == "kv"]
        mine.sort(key=lambda b: (-b.last_access, -b.created_at, b.key))
        return [b for b in mine[:limit] if not (headless and b.key in self.heads)]

    def nearest_children(
        self, parent_key: str, tokens: Sequence[int], limit: int
    ) -> list[tuple[StoredBlock, tuple[int, ...]]]:
        self._check()
        self.listings += 1
        mine = sorted(
            (self.heads[b.key], b)
            for b in self.blocks.values()
            if b.parent_key == parent_key and b.kind == "kv" and b.key in self.heads
        )
        want = tuple(tokens)
        below = [(b, h) for h, b in mine if h <= want][::-1][:limit]
        above = [(b, h) for h, b in mine if h > want][:limit]
        return below + above

    def point_children(self, parent_keys: Sequence[str]) -> list[StoredBlock]:
        self._check()
        parents = set(parent_keys)
        return [b for b in self.blocks.values() if b.parent_key in parents and b.kind != "kv"]

    def touch(self, hits: Mapping[str, float]) -> None:
        self._check()
        for key, at in hits.items():
            block = self.blocks.get(key)
            if block is not None:
                self.blocks[key] = replace(
                    block, last_access=max(block.last_access, at), hit_count=block.hit_count + 1
                )

    def remove_blocks(self, keys: Sequence[str]) -> None:
        self._check()
        for key in keys:
            self.blocks.pop(key, None)
            self.images.pop(key, None)  # ON DELETE CASCADE

    def total_bytes(self) -> int:
        self._check()
        return sum(b.nbytes for b in self.blocks.values())

    def lru_blocks(self, limit: int) -> list[StoredBlock]:
        ordered = sorted(self.blocks.values(), key=lambda b: (b.last_access, b.created_at, b.key))
        return ordered[:limit]

    def evict(self, plan: EvictionPlan, accessed_before: float | None) -> list[StoredBlock] | None:
        self._check()
        if self.evicting_elsewhere:
            return None
        candidates = (
            b
            for b in self.lru_blocks(len(self.blocks))
            if accessed_before is None or b.last_access < accessed_before
        )
        victims = plan(self.total_bytes(), candidates)
        self.remove_blocks([v.key for v in victims])
        return victims

    def usage(self) -> list[NamespaceUsage]:
        rows = []
        for digest in sorted({b.namespace for b in self.blocks.values()}):
            mine = [b for b in self.blocks.values() if b.namespace == digest]
            ns = self.namespaces.get(digest)
            rows.append(
                NamespaceUsage(
                    namespace=digest,
                    model_name=ns.model_name if ns else "",
                    blocks=len(mine),
                    nbytes=sum(b.nbytes for b in mine),
                    tokens=sum(b.token_count for b in mine if b.kind in ("kv", "external")),
                    oldest_access=min(b.last_access for b in mine),
                    newest_access=max(b.last_access for b in mine),
                    image_objects=sum(1 for b in mine if b.kind == "image"),
                    image_bytes=sum(b.nbytes for b in mine if b.kind == "image"),
                )
            )
        return rows

    def all_relpaths(self) -> set[str]:
        return {b.relpath for b in self.blocks.values()}


# --- ByteBudget --------------------------------------------------------------------


class FakeByteBudget:
    """A fixed byte limit, as ``DiskBudget`` is on a disk with room to spare; set ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.asked: list[int] = []  # the ``used`` of each call

    def limit(self, used: int) -> int:
        self.asked.append(used)
        return self.max_bytes


# --- BlockSink ---------------------------------------------------------------------


class FakeBlockSink:
    """The write queue over a fake store and index: ``submit`` queues, ``drain`` writes.

    Writes the way the real writer does: content-addressed file first, row second.
    ``accept=False`` makes it drop every block (a full queue).
    """

    def __init__(self, store: FakeBlockStore, index: FakeBlockIndex, clock: FakeClock) -> None:
        self.store, self.index, self.clock = store, index, clock
        self.queue: dict[str, tuple[BlockMeta, NamespaceInfo, bytes]] = {}
        self.accept = True

    def submit(
        self,
        meta: BlockMeta,
        namespace: NamespaceInfo,
        data: bytes,
        *,
        wait: float = 0.0,
        done: Callable[[str], None] | None = None,
    ) -> bool:
        """Queued for ``drain``; a caller that asks to be told the outcome (``done``, an
        import) has its block written at once, the way the real writer ends its wait."""
        if not self.accept:
            return False
        if done is not None:
            done(self._write(meta, namespace, bytes(data)))
            return True
        self.queue.setdefault(meta.key, (meta, namespace, bytes(data)))
        return True

    def pending(self, key: str) -> bool:
        return key in self.queue

    def has_room(self) -> bool:
        return self.accept

    def drain(self) -> int:
        written = 0
        for meta, namespace, data in list(self.queue.values()):
            self._write(meta, namespace, data)
            written += 1
        self.queue.clear()
        return written

    def _write(self, meta: BlockMeta, namespace: NamespaceInfo, data: bytes) -> str:
        if meta.key in self.index.blocks:
            return "skipped_existing"
        checksum = hashlib.sha256(data).hexdigest()
        rel = self.store.relpath(namespace, meta.key, checksum)
        self.store.write(rel, data)
        now = self.clock.now()
        row = StoredBlock(
            meta.key,
            meta.namespace,
            meta.parent_key,
            meta.token_count,
            len(data),
            checksum,
            rel,
            now,
            now,
            kind=meta.kind,
            computed_by=meta.computed_by or None,
        )
        self.index.upsert_namespace(namespace)
        # Tokens recorded as the real writer does (the index ranks siblings by them).
        added = self.index.add_block(row, meta.tokens if meta.kind == "kv" else (), meta.image)
        if not added and self.index.blocks[meta.key].relpath != rel:
            self.store.delete(rel)
        return "written"


# --- ColdSource --------------------------------------------------------------------


class FakeColdSource:
    """The cold tier as a dict of encoded blocks; ``get`` verifies like the real one."""

    def __init__(
        self,
        decode: Callable[[bytes], DecodedBlock] | None = None,
        check: Callable[[bytes, BlockMeta], str | None] | None = None,
    ) -> None:
        self._decode = decode if decode is not None else FakeCodec().decode
        # The fake codec's check goes with its decode; a real codec's decode comes with
        # the check its test gives (none by default).
        if check is None:
            check = FakeCodec().check if decode is None else (lambda data, meta: None)
        self._check = check
        self.forgotten: list[str] = []  # keys a restore found unusable
        self.blocks: dict[str, tuple[BlockMeta, tuple[int, ...], bytes]] = {}
        self.puts: list[str] = []
        # The writer's free queue slots: None, always room; each put takes one.
        self.room: int | None = None
        self.refused: list[str] = []  # puts turned away for want of room
        self.gets: list[str] = []
        self.batches: list[list[str]] = []  # the chains asked of get_many
        self.touched: list[str] = []
        self.read_recorded: list[str] = []  # reads that count in recency (not a no-store's)
        self.children_calls: list[str] = []
        self.present_calls: list[list[str]] = []
        self.rows_calls: list[list[str]] = []
        self.batch_rows: list[bool] = []  # per get_many: whether its rows were given

    def get(
        self, key: str, parent_key: str, *, touch: bool = True
    ) -> tuple[tuple[int, ...], Any] | None:
        self.gets.append(key)
        if touch:
            self.read_recorded.append(key)
        entry = self.blocks.get(key)
        if entry is None:
            return None
        try:
            decoded = self._decode(entry[2])
        except ValueError:
            del self.blocks[key]  # corrupt: dropped, never served
            return None
        if object_key(entry[0].kind, block_key(parent_key, decoded.tokens)) != key:
            del self.blocks[key]
            return None
        if self._check(entry[2], entry[0]) is not None:
            del self.blocks[key]
            return None
        return decoded.tokens, decoded.payload

    def get_many(
        self,
        chain: Sequence[tuple[str, str]],
        *,
        touch: bool = True,
        rows: Mapping[str, StoredBlock] | None = None,
    ) -> Generator[tuple[tuple[int, ...], Any], None, None]:
        """Lazily, one ``get`` per block as the caller asks for it (no read-ahead); with
        ``rows`` (already asked), a key without one is a miss without looking."""
        self.batches.append([key for key, _ in chain])
        self.batch_rows.append(rows is not None)
        for key, parent_key in chain:
            if rows is not None and key not in rows:
                return
            found = self.get(key, parent_key, touch=touch)
            if found is None:
                return
            yield found

    def put(self, meta: BlockMeta, tokens: Sequence[int], data: bytes) -> bool:
        if self.room is not None:
            if self.room == 0:
                self.refused.append(meta.key)
                return False
            self.room -= 1
        self.puts.append(meta.key)
        self.blocks[meta.key] = (meta, tuple(tokens), data)
        return True

    def has_room(self) -> bool:
        return self.room != 0

    def contains(self, key: str) -> bool:
        return key in self.blocks

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            if self.blocks.pop(key, None) is not None:
                self.forgotten.append(key)

    def file_rows(self, keys: Sequence[str]) -> list[StoredBlock]:
        """Rows (made up from the metadata) of ``keys``, to the first one missing."""
        out = []
        for key in keys:
            if key not in self.blocks:
                break
            out.append(self._row(key))
        return out

    def read_files(self, rows: Sequence[StoredBlock]) -> Iterator[tuple[StoredBlock, bytes]]:
        for row in rows:
            if row.key not in self.blocks:
                return
            yield row, self.blocks[row.key][2]

    def verify(
        self, data: bytes, meta: BlockMeta, *, values: bool = True
    ) -> tuple[DecodedBlock | None, str]:
        try:
            decoded = self._decode(data)
        except ValueError as exc:
            return None, f"it cannot be decoded ({exc})"
        if object_key(meta.kind, block_key(meta.parent_key, decoded.tokens)) != meta.key:
            return None, "its tokens do not rehash to its key"
        if decoded.metadata.get("namespace", meta.namespace) != meta.namespace:
            return None, "its metadata names another namespace"
        problem = self._check(data, meta)
        if problem is not None:
            return None, problem
        return decoded, ""

    def rows(self, keys: Sequence[str]) -> dict[str, StoredBlock] | None:
        self.rows_calls.append(list(keys))
        return {k: self._row(k) for k in keys if k in self.blocks}

    def _row(self, key: str) -> StoredBlock:
        meta, _, data = self.blocks[key]
        digest = hashlib.sha256(data).hexdigest()
        path = f"{key}.safetensors"
        return StoredBlock(
            key,
            meta.namespace,
            meta.parent_key,
            meta.token_count,
            len(data),
            digest,
            path,
            0.0,
            0.0,
            kind=meta.kind,
            computed_by=meta.computed_by or None,
        )

    def present(self, keys: Sequence[str]) -> set[str]:
        self.present_calls.append(list(keys))
        return {k for k in keys if k in self.blocks}

    def point_children(self, parent_keys: Sequence[str]) -> list[BlockMeta]:
        parents = set(parent_keys)
        return [m for m, _, _ in self.blocks.values() if m.parent_key in parents and m.kind != "kv"]

    def children(self, parent_key: str, want: Sequence[int] = ()) -> list[BlockMeta]:
        self.children_calls.append(parent_key)
        return [
            meta
            for meta, _, _ in self.blocks.values()
            if meta.parent_key == parent_key and meta.kind == "kv"
        ]

    def touch(self, keys: Sequence[str]) -> None:
        self.touched.extend(keys)


# --- KeptCaches --------------------------------------------------------------------


class FakeKeptCaches:
    """Finished list caches, the last ``entries`` of them; ``take`` cuts a copy at the prefix."""

    def __init__(self, entries: int = 2, max_bytes: int = 1 << 30) -> None:
        self.entries, self.max_bytes = entries, max_bytes
        self.kept: list[tuple[tuple[int, ...], list[int]]] = []
        self.taken = 0

    @property
    def nbytes(self) -> int:
        return sum(8 * len(cache) for _, cache in self.kept)

    def take(self, prompt: Sequence[int], prefix: int) -> list[int] | None:
        wanted = tuple(prompt[:prefix])
        for tokens, cache in reversed(self.kept):
            if tokens[:prefix] == wanted and len(tokens) >= prefix:
                self.taken += 1
                return list(cache[:prefix])
        return None

    def keep(self, tokens: Sequence[int], cache: list[int]) -> None:
        if self.entries > 0 and len(cache) == len(tokens):
            self.kept = [*self.kept, (tuple(tokens), list(cache))][-self.entries :]

    def fits(self, nbytes: int) -> bool:
        return self.entries > 0 and nbytes <= self.max_bytes

    def held_for(self, prefix: Sequence[int]) -> int:
        spared = self._holding(prefix)
        return 8 * len(spared[1]) if spared is not None else 0

    def shrink(self, max_bytes: int, spare: Sequence[int] = ()) -> None:
        spared = self._holding(spare)
        others = [e for e in self.kept if e is not spared]
        while others and sum(8 * len(cache) for _, cache in others) > max_bytes:
            others.pop(0)
        self.kept = [e for e in self.kept if e is spared or any(e is o for o in others)]

    def clear(self) -> None:
        self.kept.clear()

    def _holding(self, prefix: Sequence[int]) -> tuple[tuple[int, ...], list[int]] | None:
        """The newest entry holding ``prefix`` (``take``'s pick); None for an empty prefix."""
        wanted = tuple(prefix)
        for entry in reversed(self.kept):
            if wanted and entry[0][: len(wanted)] == wanted:
                return entry
        return None


# --- GrammarCompiler / TokenConstraint ---------------------------------------------


class FakeTokenConstraint:
    """Allows every token; records the tokens it was given."""

    def __init__(self, grammar: Any, vocab_size: int = 256) -> None:
        self.grammar = grammar
        self.vocab_size = vocab_size
        self.tokens: list[int] = []

    def fill_bitmask(self, out: Any) -> None:
        out[:] = -1

    def advance(self, token: int) -> bool:
        self.tokens.append(token)
        return True

    def validate(self, tokens: list[int]) -> int:
        return len(tokens)

    def rollback(self, count: int) -> None:
        del self.tokens[len(self.tokens) - count :]

    def failure(self) -> str | None:
        return None


class FakeGrammarCompiler:
    """Records the grammars asked for; refuses any whose JSON schema contains ``"refuse"``."""

    def __init__(self) -> None:
        self.grammars: list[Any] = []

    def constraint(self, grammar: Any) -> FakeTokenConstraint:
        from omlx.domain.grammar import GrammarError

        if grammar.json_schema is not None and "refuse" in grammar.json_schema:
            raise GrammarError("the fake compiler refuses this schema")
        self.grammars.append(grammar)
        return FakeTokenConstraint(grammar)

    def token_bytes(self, token: int) -> bytes:
        return bytes([token % 256])


# --- HotSetStore -------------------------------------------------------------------


class FakeHotSetStore:
    """The saved hot set in memory; every save kept, to see when and what was recorded."""

    def __init__(self, saved: HotSet | None = None) -> None:
        self.saves: list[HotSet] = [saved] if saved is not None else []

    def load(self) -> HotSet | None:
        return self.saves[-1] if self.saves else None

    def save(self, hot_set: HotSet) -> None:
        self.saves.append(hot_set)
