"""Each image's rows (its encoder's output in the language model's embedding space), by digest.

The rows are what a vision-language model writes over its placeholder tokens' embeddings:
the vision tower's output, projected (and scaled, for Gemma 3) exactly as the model's own
``get_input_embeddings`` would. They are computed once per image digest, when a prefill
first meets the image's key ids, and kept in an LRU within a byte budget: a prompt that
changes after an image, a turn that restores nothing, or a second conversation showing
the same screenshot costs no encoder pass. A prompt whose image positions all come back
from the prefix cache never meets them, so it costs none either (after a restart too).

The engine thread asks by key id (``rows_at``); the request threads register images
(``register``) with what computes their rows, before the request reaches the engine.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

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

    def register(self, digest: str, count: int, encode: Callable[[], mx.array]) -> None:
        """``digest``'s image takes ``count`` placeholder tokens; ``encode`` computes its rows."""
        start = image_start(digest)
        with self._lock:
            known = self._images.get(start)
            if known is not None and known.digest != digest:
                raise ImageRowsMissing(
                    f"images {known.digest[:12]} and {digest[:12]} drew the same key ids; "
                    "send the request again after the other one has finished"
                )
            if known is not None:
                known.count, known.encode = count, encode
                self._images.move_to_end(start)
                return
            clash = self._overlapping(start, count)
            if clash is not None:
                raise ImageRowsMissing(
                    f"images {clash.digest[:12]} and {digest[:12]} drew overlapping key ids; "
                    "send the request again after the other one has finished"
                )
            self._images[start] = _Image(digest, count, encode)
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
            image = self._image_at(token_id)
            return image.digest if image is not None else None

    def _image_at(self, token_id: int) -> _Image | None:
        i = bisect.bisect_right(self._starts, token_id) - 1
        image = self._images.get(self._starts[i]) if i >= 0 else None
        if image is None or token_id >= self._starts[i] + image.count:
            return None
        return image

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

    def rows_at(self, token_id: int) -> tuple[mx.array, int]:
        """The rows of the image ``token_id`` belongs to, and the token's index in them."""
        with self._lock:
            image = self._image_at(token_id)
            if image is None:
                raise ImageRowsMissing(
                    f"key id {token_id} names no image this server was sent recently"
                )
            index = token_id - image_start(image.digest)
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

    def _keep(self, digest: str, rows: mx.array) -> None:
        if digest in self._rows:
            return
        self._rows[digest] = rows
        self._held += rows.nbytes
        while self._held > self.budget_bytes and len(self._rows) > 1:
            _, old = self._rows.popitem(last=False)
            self._held -= old.nbytes
            self.evictions += 1
