"""``S3BlockStore``: block files as objects in an S3-compatible bucket (AWS S3, R2, SeaweedFS,
MinIO, Ceph RGW), through obstore (Rust's object_store; its calls release the GIL).

Object names are the folder store's relative paths under the location's prefix, so the
checksum in the name makes every object content-addressed: a write is one atomic PUT,
create-only (``If-None-Match: *``) where the store has it, and "already exists" is
success (the object by that name holds the same bytes). No temporary objects exist.
Reads go through ``ReadAhead`` (parallel GETs within the batch's time budget) and
``verified_read`` (size and SHA-256 against the row): a partial or corrupt object is
never served. Timeouts are short, so a down or hung store turns into misses within the
read budget; after a failed read the store is not asked again for ``FAIL_FAST_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from datetime import timedelta
from typing import Any

from omlx.adapters.blockfiles.budget import SizeBudget
from omlx.adapters.blockfiles.reader import ReadAhead, verified_read
from omlx.adapters.blockfiles.store import block_relpath, is_block_relpath
from omlx.adapters.disk_faults import FaultEpisodes
from omlx.adapters.objectstore.errors import (
    ObjectStoreError,
    StoreDenied,
    StoreUnreachable,
    store_error,
)
from omlx.adapters.objectstore.location import S3Access, S3Location, resolve_access
from omlx.domain.cache.blocks import BlockRead, NamespaceInfo, StoredBlock

log = logging.getLogger(__name__)

# A GET of one block (a few MB) takes milliseconds on a LAN: these bound a dead or hung
# store well inside a batch's read budget (5 s and up, blockfiles.reader).
CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 5.0
MAX_RETRIES = 2  # obstore's own retries of 5xx, 429 and dropped connections
RETRY_TIMEOUT_S = 4.0
FAIL_FAST_S = 1.0  # after a failed read, reads miss at once for this long
READ_THREADS = 16  # GETs in flight per batch: a network's latency, not a disk's queue
LIST_CHUNK = 1000


class S3BlockStore:
    """The ``BlockStore`` port over one bucket and prefix."""

    def __init__(
        self,
        location: S3Location,
        access: S3Access | None = None,
        *,
        read_threads: int = READ_THREADS,
    ) -> None:
        try:
            from obstore.store import S3Store
        except ModuleNotFoundError:
            raise ValueError(
                "an object store needs the obstore package: pip install 'omlx[s3]'"
            ) from None

        self.location = location
        self.label = f"object store {location.url}"  # in log lines about its faults
        access = access if access is not None else resolve_access()
        self.access = access
        self._store = S3Store(
            location.bucket,
            prefix=location.prefix or None,
            config=access.config(),  # type: ignore[arg-type]
            client_options={
                "allow_http": access.allow_http,
                "connect_timeout": timedelta(seconds=CONNECT_TIMEOUT_S),
                "timeout": timedelta(seconds=REQUEST_TIMEOUT_S),
            },
            retry_config={
                "max_retries": MAX_RETRIES,
                "retry_timeout": timedelta(seconds=RETRY_TIMEOUT_S),
                "backoff": {
                    "init_backoff": timedelta(milliseconds=50),
                    "max_backoff": timedelta(seconds=1),
                    "base": 2,
                },
            },
        )
        self._conditional = True  # create-only PUTs, until the store says it has none
        self._reader = ReadAhead(self._verified_read, read_threads)
        self._faults = FaultEpisodes(
            self.label,
            log,
            what="blocks stored there are misses",
            again="answers again",
            counted="reads failed",
        )
        self._lock = threading.Lock()
        self._quiet_until = 0.0  # monotonic time until which reads fail fast
        self.requests = 0  # GETs sent (tests and the bench count them)

    # --- the BlockStore port -----------------------------------------------------------

    def relpath(self, namespace: NamespaceInfo, key: str, checksum: str) -> str:
        return block_relpath(namespace, key, checksum)

    def budget(self, max_bytes: int) -> SizeBudget:
        """``max_bytes`` alone: this machine's free space says nothing about a bucket's."""
        return SizeBudget(max_bytes)

    def write(self, relpath: str, data: bytes) -> None:
        """One atomic PUT; raises ``ObjectStoreError`` (the writer retries a transient one)."""
        import obstore as obs
        import obstore.exceptions as obx

        name = self._name(relpath)
        try:
            obs.put(self._store, name, data, mode=self._put_mode(), use_multipart=False)
        except (obx.AlreadyExistsError, obx.PreconditionError):
            return  # the same name holds the same bytes: written already
        except Exception as exc:
            unsupported = isinstance(exc, obx.NotSupportedError) or "status code: 501" in str(exc)
            if not (unsupported and self._conditional):
                raise store_error(exc, f"PUT {name}") from None
            self._no_conditional_puts()  # a store without If-None-Match: plain PUTs from now
            self.write(relpath, data)

    def read(self, relpath: str) -> bytes:
        """The object's bytes; ``FileNotFoundError`` when it is gone, else ``ObjectStoreError``."""
        return bytes(self.read_buffer(relpath))

    def read_buffer(self, relpath: str) -> memoryview:
        """``read`` without copying obstore's buffer (a restore's blocks are megabytes, and a
        fresh page costs a fault); what checked reads and the read-through tier use."""
        import obstore as obs

        name = self._name(relpath)
        if time.monotonic() < self._quiet_until:
            error: OSError = StoreUnreachable(f"GET {name}: skipped, the store failed just now")
            self._faults.failed(StoreUnreachable.fault, error)
            raise error
        try:
            with self._lock:
                self.requests += 1
            data = memoryview(obs.get(self._store, name).bytes())
        except Exception as exc:
            error = store_error(exc, f"GET {name}")
            if isinstance(error, ObjectStoreError):
                self._quiet_until = time.monotonic() + FAIL_FAST_S
                self._faults.failed(error.fault, error)
            raise error from None
        self._faults.succeeded()
        return data

    def read_many(self, blocks: Sequence[StoredBlock]) -> Generator[BlockRead, None, None]:
        return self._reader.read_many(blocks)

    def close(self) -> None:
        self._reader.close()

    def delete(self, relpath: str) -> None:
        import obstore as obs

        name = self._name(relpath)
        try:
            obs.delete(self._store, name)
        except Exception as exc:
            error = store_error(exc, f"DELETE {name}")
            if not isinstance(error, FileNotFoundError):
                raise error from None

    def iter_relpaths(self) -> Iterator[str]:
        for relpath, _, _ in self.iter_objects():
            yield relpath

    def remove_temp_files(
        self, older_than: float | None = None, *, own_older_than: float | None = None
    ) -> int:
        """None exist: a PUT is atomic (an interrupted one leaves no object)."""
        return 0

    # --- what a sweep needs (``blockfiles.maintenance.ListableStore``) -------------------

    def iter_objects(self) -> Iterator[tuple[str, int, float]]:
        """Every block object: ``(relpath, size, last_modified)``, one paged listing."""
        import obstore as obs

        try:
            for page in obs.list(self._store, chunk_size=LIST_CHUNK):
                for meta in page:
                    path = str(meta["path"])
                    if is_block_relpath(path):
                        yield path, int(meta["size"]), meta["last_modified"].timestamp()
        except Exception as exc:
            raise store_error(exc, f"LIST {self.location.url}") from None

    def file_info(self, relpath: str) -> tuple[int, float] | None:
        """``(size, last_modified)`` of an object, or None when there is none."""
        import obstore as obs

        name = self._name(relpath)
        try:
            meta = obs.head(self._store, name)
        except Exception as exc:
            error = store_error(exc, f"HEAD {name}")
            if isinstance(error, FileNotFoundError):
                return None
            raise error from None
        return int(meta["size"]), meta["last_modified"].timestamp()

    def prune_empty_dirs(self) -> int:
        return 0  # a bucket has no folders to remove

    def check(self) -> None:
        """One request that needs the bucket and our credentials (a listing of one level).

        Raises ``StoreDenied`` (credentials refused, no such bucket) or
        ``StoreUnreachable`` (no answer), each with one line that says so.
        """
        import obstore as obs

        try:
            obs.list_with_delimiter(self._store)
        except Exception as exc:
            error = store_error(exc, f"{self.location.url} (endpoint {self._endpoint()})")
            if isinstance(error, FileNotFoundError):  # a listing names no object: the bucket
                raise StoreDenied(f"{self.location.url}: no such bucket") from None
            raise error from None

    # --- helpers ------------------------------------------------------------------------

    def _verified_read(self, block: StoredBlock) -> BlockRead:
        return verified_read(self.read_buffer, block)

    def _name(self, relpath: str) -> str:
        if not is_block_relpath(relpath):
            raise ValueError(f"bad relative path {relpath!r}")
        return relpath

    def _put_mode(self) -> Any:
        return "create" if self._conditional else "overwrite"

    def _no_conditional_puts(self) -> None:
        if self._conditional:
            self._conditional = False
            log.info(
                "%s has no create-only PUT (If-None-Match); writing plain PUTs (an object's "
                "name carries its checksum, so a rewrite holds the same bytes)",
                self.label,
            )

    def _endpoint(self) -> str:
        return self.access.endpoint or f"AWS S3, {self.access.region}"


__all__ = ["S3BlockStore", "StoreDenied", "StoreUnreachable"]
