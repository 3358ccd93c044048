"""Images a prompt carries, decoded: the API-neutral form the engine receives.

The digest names the pixels, not the file: the same picture sent as PNG or as lossless
WebP is one image to the cache and to the diagnostics.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

_DIGEST_PREFIX = b"omlx-image-v1\0"


def image_digest(width: int, height: int, rgb: bytes) -> str:
    """SHA-256 hex of the prefix, the size (two uint32 LE) and the RGB8 rows."""
    h = hashlib.sha256(_DIGEST_PREFIX)
    h.update(struct.pack("<II", width, height))
    h.update(rgb)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class PromptImage:
    """One image of a prompt: ``width*height*3`` bytes of RGB8, rows top to bottom."""

    digest: str  # image_digest(width, height, rgb)
    width: int
    height: int
    rgb: bytes = field(repr=False, compare=False)
    part: str = field(
        default="", compare=False
    )  # where the client sent it: "messages[2].content[1]"

    @classmethod
    def of(cls, width: int, height: int, rgb: bytes, part: str = "") -> PromptImage:
        return cls(image_digest(width, height, rgb), width, height, rgb, part)
