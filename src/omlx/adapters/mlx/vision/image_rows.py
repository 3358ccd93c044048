"""Each image's rows (its encoder's output in the language model's embedding space), by key id.

The rows are what a vision-language model writes over its placeholder tokens' embeddings:
the vision tower's output, projected (and scaled, for Gemma 3) exactly as the model's own
``get_input_embeddings`` would. They are computed once per image digest and tenant, when a
prefill first meets the image's key ids, and kept in the block cache's tiers
(``domain/cache/image_rows``): in RAM within the hot tier's budget, and on the SSD tier as
files the index lists, so a prompt that changes after an image, a turn that restores
nothing, or a second conversation showing the same screenshot costs no encoder pass, after
a restart too. A prompt whose image positions all come back from the prefix cache never
meets them, so it costs none either.

The engine thread asks by key id (``rows_at``); the request threads register images
(``register``) with what computes their rows, before the request reaches the engine. A
tenant's images have key ids of their own (``image_keys``), so the ids alone name whose
rows they are. A no-store request's rows are kept nowhere but in a few transient slots (so
an image that spans several prefill chunks is encoded once). An M-RoPE model's engine asks
``image_at`` for an image's grid (registered with it): what places its tokens.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from omlx.adapters.mlx.vision.mrope import Grid
from omlx.adapters.mlx.vision.rows_codec import MLXRowsCodec
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.image_keys import image_start
from omlx.domain.cache.image_rows import ImageRowsTiers

# Images whose prepared pixels are kept, ready to encode (again, if their rows left the
# tiers): the most recently sent ones. A registration older than this many later ones is
# forgotten; a prefill that still needs it fails with a clear error.
KEPT_IMAGES = 256
# Rows no tier keeps in RAM (a no-store request's; rows larger than the hot tier), held
# only while their prefill may need them again: the most recent few.
TRANSIENT_ROWS = 4
# The root of a model without a prefix cache (its rows live in a RAM tier of their own).
NO_NAMESPACE = "0" * 64


class ImageRowsMissing(ValueError):
    """A prefill met key ids of an image nobody registered (or registered long ago)."""


@dataclass(slots=True)
class _Image:
    digest: str
    tenant: str | None
    count: int
    encode: Callable[[], mx.array]  # computes the rows [count, hidden]
    store: bool  # the latest registering request may keep them (not a no-store one)
    grid: Grid | None = None  # (t, h, w) tokens, for M-RoPE positions; None for others


class ImageRows:
    """The key-id intervals of known images, and their rows in the tiers (``ImageRowsTiers``).

    Built with a RAM tier of its own (``budget_bytes``); ``use`` moves the rows into a
    model's prefix cache tiers once they exist (its hot tier's budget, its SSD tier).
    """

    def __init__(self, budget_bytes: int) -> None:
        self._lock = threading.Lock()
        self.tiers = ImageRowsTiers(NO_NAMESPACE, MLXRowsCodec(), HotTier(budget_bytes))
        # Rows RAM's tier does not hold, for the rest of a prefill: (rows, kept in the tiers).
        self._transient: OrderedDict[tuple[str, str | None], tuple[mx.array, bool]] = OrderedDict()
        self._images: OrderedDict[int, _Image] = OrderedDict()  # start id -> image
        self._starts: list[int] = []  # sorted keys of _images
        self.encoder_passes = 0

    def use(self, tiers: ImageRowsTiers) -> None:
        """Keep rows in ``tiers`` from now on (the model's prefix cache: wired at load)."""
        self.tiers = tiers

    # ---- request threads ----------------------------------------------------

    def register(
        self,
        digest: str,
        count: int,
        encode: Callable[[], mx.array],
        grid: Grid | None = None,
        *,
        tenant: str | None = None,
        store: bool | None = None,
    ) -> None:
        """``digest``'s image takes ``count`` placeholder tokens in ``tenant``'s prompts (a
        ``grid`` of them, for an M-RoPE model); ``encode`` computes its rows. ``store``:
        whether the request that will run may keep them (False: a no-store request); None
        leaves it as registered (a prompt only counted or explained), True for a new image."""
        start = image_start(digest, tenant)
        with self._lock:
            known = self._images.get(start)
            if known is not None and (known.digest, known.tenant) != (digest, tenant or None):
                raise ImageRowsMissing(
                    f"images {known.digest[:12]} and {digest[:12]} drew the same key ids; "
                    "send the request again after the other one has finished"
                )
            if known is not None:
                known.count, known.encode, known.grid = count, encode, grid
                if store is not None:
                    known.store = store
                self._images.move_to_end(start)
                return
            clash = self._overlapping(start, count)
            if clash is not None:
                raise ImageRowsMissing(
                    f"images {clash.digest[:12]} and {digest[:12]} drew overlapping key ids; "
                    "send the request again after the other one has finished"
                )
            self._images[start] = _Image(
                digest, tenant or None, count, encode, store is not False, grid
            )
            bisect.insort(self._starts, start)
            while len(self._images) > KEPT_IMAGES:
                old, _ = self._images.popitem(last=False)
                self._starts.remove(old)

    def _overlapping(self, start: int, count: int) -> _Image | None:
        """A kept image whose key ids share some with [start, start + count)."""
        i = bisect.bisect_left(self._starts, start)
        before = self._images[self._starts[i - 1]] if i > 0 else None
        if before is not None and self._starts[i - 1] + before.count > start:
            return before
        if i < len(self._starts) and self._starts[i] < start + count:
            return self._images[self._starts[i]]
        return None

    def digest_at(self, token_id: int) -> str | None:
        """The digest of the kept image ``token_id`` is a key id of (None: none kept)."""
        with self._lock:
            found = self._image_at(token_id)
            return found[1].digest if found is not None else None

    def _image_at(self, token_id: int) -> tuple[int, _Image] | None:
        """The kept image whose key ids hold ``token_id``, with its first key id."""
        i = bisect.bisect_right(self._starts, token_id) - 1
        image = self._images.get(self._starts[i]) if i >= 0 else None
        if image is None or token_id >= self._starts[i] + image.count:
            return None
        return self._starts[i], image

    def stats(self) -> dict[str, int | bool]:
        """What ``/health`` shows under ``models.<id>.images`` (any thread)."""
        tiers = self.tiers
        s = tiers.stats()
        held = tiers.held()
        return {
            "images": held[0],
            "bytes": held[1],
            "budget_bytes": tiers.budget_bytes,
            "encoder_passes": self.encoder_passes,
            "hits": s.ram_hits + s.ssd_hits,
            "ram_hits": s.ram_hits,
            "ssd_hits": s.ssd_hits,
            "queued_for_ssd": s.queued,
            "rejected": s.rejected,
            "ssd": tiers.on_disk,
        }

    def clear(self) -> None:
        """Forget the rows held in RAM (the SSD tier's stay): the next prefill reads or
        encodes them again."""
        with self._lock:
            self._transient.clear()
        self.tiers.drop_ram()

    # ---- engine thread ------------------------------------------------------

    def image_at(self, token_id: int) -> tuple[int, int, Grid | None]:
        """The first key id, token count and grid of the image ``token_id`` belongs to."""
        with self._lock:
            found = self._image_at(token_id)
        if found is None:
            raise ImageRowsMissing(
                f"key id {token_id} names no image this server was sent recently"
            )
        start, image = found
        return start, image.count, image.grid

    def rows_at(self, token_id: int) -> tuple[mx.array, int]:
        """The rows of the image ``token_id`` belongs to, and the token's index in them."""
        with self._lock:
            found = self._image_at(token_id)
            if found is None:
                raise ImageRowsMissing(
                    f"key id {token_id} names no image this server was sent recently"
                )
            start, image = found
            index = token_id - start
            digest, tenant, store, encode = image.digest, image.tenant, image.store, image.encode
            slot = self._transient.get((digest, tenant))
            if slot is not None:
                self._transient.move_to_end((digest, tenant))
        if slot is not None:
            rows, kept = slot
            if store and not kept:  # a no-store request's rows, now wanted by a storing one
                self.tiers.put(digest, tenant, rows)
                self._hold(digest, tenant, rows, True)
            return rows, index
        rows = self.tiers.get(digest, tenant, store=store)
        if rows is None:
            rows = encode()  # the encoder pass, outside the lock: other requests go on
            mx.eval(rows)
            with self._lock:
                self.encoder_passes += 1
            if store:
                self.tiers.put(digest, tenant, rows)
        if not store or not self.tiers.in_ram(digest, tenant):
            # Rows RAM does not hold (a no-store request's, or too large for the hot tier)
            # stay for the rest of this prefill: its next chunk finds them here.
            self._hold(digest, tenant, rows, store)
        return rows, index

    def _hold(self, digest: str, tenant: str | None, rows: mx.array, kept: bool) -> None:
        with self._lock:
            self._transient[(digest, tenant)] = (rows, kept)
            self._transient.move_to_end((digest, tenant))
            while len(self._transient) > TRANSIENT_ROWS:
                self._transient.popitem(last=False)
