"""Each image's rows (its encoder's output in the language model's embedding space), by digest.

The rows are what a vision-language model writes over its placeholder tokens' embeddings:
the vision tower's output, projected (and scaled, for Gemma 3) exactly as the model's own
``get_input_embeddings`` would. They are computed once per image digest, when a prefill
first meets the image's key ids, and kept in an LRU within a byte budget: a prompt that
changes after an image, a turn that restores nothing, or a second conversation showing
the same screenshot costs no encoder pass. A prompt whose image positions all come back
from the prefix cache never meets them, so it costs none either (after a restart too).

The engine thread asks by key id (``rows_at``, and ``image_at`` for an M-RoPE model's
positions); the request threads register images (``register``) with what computes their
rows, and their grid where the model places image tokens by one, before the request
reaches the engine.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from omlx.adapters.mlx.vision.mrope import Grid
from omlx.domain.cache.image_keys import image_start

# Images whose prepared pixels are kept, ready to encode (again, if their rows left the
# LRU): the most recently sent ones. A registration older than this many later ones is
# forgotten; a prefill that still needs it fails with a clear error.
KEPT_IMAGES = 256


class ImageRowsMissing(ValueError):
    """A prefill met key ids of an image nobody registered (or registered long ago)."""


@dataclass(slots=True)
class _Image:
    digest: str
    count: int
    encode: Callable[[], mx.array]  # computes the rows [count, hidden]
    grid: Grid | None  # (t, h, w) tokens, for M-RoPE positions; None for other models


class ImageRows:
    """Rows by digest within ``budget_bytes``, and the key-id intervals of known images."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._rows: OrderedDict[str, mx.array] = OrderedDict()
        self._held = 0
        self._images: OrderedDict[int, _Image] = OrderedDict()  # start id -> image
        self._starts: list[int] = []  # sorted keys of _images
        self.encoder_passes = 0
        self.hits = 0
        self.evictions = 0

    # ---- request threads ----------------------------------------------------

    def register(
        self,
        digest: str,
        count: int,
        encode: Callable[[], mx.array],
        grid: Grid | None = None,
    ) -> None:
        """``digest``'s image takes ``count`` placeholder tokens (a ``grid`` of them, for an
        M-RoPE model); ``encode`` computes its rows."""
        start = image_start(digest)
        with self._lock:
            known = self._images.get(start)
            if known is not None and known.digest != digest:
                raise ImageRowsMissing(
                    f"images {known.digest[:12]} and {digest[:12]} drew the same key ids; "
                    "send the request again after the other one has finished"
                )
            if known is not None:
                known.count, known.encode, known.grid = count, encode, grid
                self._images.move_to_end(start)
                return
            clash = self._overlapping(start, count)
            if clash is not None:
                raise ImageRowsMissing(
                    f"images {clash.digest[:12]} and {digest[:12]} drew overlapping key ids; "
                    "send the request again after the other one has finished"
                )
            self._images[start] = _Image(digest, count, encode, grid)
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

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "images": len(self._rows),
                "bytes": self._held,
                "budget_bytes": self.budget_bytes,
                "encoder_passes": self.encoder_passes,
                "hits": self.hits,
                "evictions": self.evictions,
            }

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()
            self._held = 0

    # ---- engine thread ------------------------------------------------------

    def image_at(self, token_id: int) -> tuple[int, int, Grid | None]:
        """The first key id, token count and grid of the image ``token_id`` belongs to."""
        with self._lock:
            start, image = self._find(token_id)
            return start, image.count, image.grid

    def rows_at(self, token_id: int) -> tuple[mx.array, int]:
        """The rows of the image ``token_id`` belongs to, and the token's index in them."""
        with self._lock:
            start, image = self._find(token_id)
            index = token_id - start
            rows = self._rows.get(image.digest)
            if rows is not None:
                self._rows.move_to_end(image.digest)
                self.hits += 1
                return rows, index
            encode = image.encode
        rows = encode()  # the encoder pass, outside the lock: other requests go on
        mx.eval(rows)
        with self._lock:
            self.encoder_passes += 1
            self._keep(image.digest, rows)
        return rows, index

    def _find(self, token_id: int) -> tuple[int, _Image]:
        """(first key id, image) of the kept image ``token_id`` belongs to (lock held)."""
        i = bisect.bisect_right(self._starts, token_id) - 1
        image = self._images.get(self._starts[i]) if i >= 0 else None
        if image is None or token_id >= self._starts[i] + image.count:
            raise ImageRowsMissing(
                f"key id {token_id} names no image this server was sent recently"
            )
        return self._starts[i], image

    def _keep(self, digest: str, rows: mx.array) -> None:
        if digest in self._rows:
            return
        self._rows[digest] = rows
        self._held += rows.nbytes
        while self._held > self.budget_bytes and len(self._rows) > 1:
            _, old = self._rows.popitem(last=False)
            self._held -= old.nbytes
            self.evictions += 1
