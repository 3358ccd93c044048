"""Image bytes decoded into a ``PromptImage``: sniffed, size-checked, then decoded (Pillow).

Pillow is imported here, lazily, so a server without the vision extra still starts and
answers an image with a clear 400. Every failure is an ``InvalidRequest`` naming the part.
Call ``decode_image`` off the event loop: decoding a large picture takes a while.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from functools import cache
from types import ModuleType

from omlx.app.errors import InvalidRequest
from omlx.domain.images import PromptImage

# Decided by the bytes, not by a media type the client states.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
NO_PILLOW = "images need the vision extra: pip install 'omlx[vision]'"


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_pixels: int = 25_000_000
    max_bytes: int = 20 * 1024**2  # encoded, as sent or fetched
    max_images: int = 16  # per request
    allow_urls: bool = False  # http(s) image URLs fetched by the server
    url_timeout_s: float = 10.0  # the whole fetch of one URL


@cache
def pillow() -> ModuleType:
    """``PIL.Image``, with its decompression-bomb warning made an error (turned into a 400)."""
    try:
        from PIL import Image
    except ImportError:
        raise InvalidRequest(NO_PILLOW, param="messages") from None
    warnings.filterwarnings("error", category=Image.DecompressionBombWarning)
    return Image


def decode_image(data: bytes, part: str, limits: ImageLimits) -> PromptImage:
    """``data`` (PNG, JPEG, WebP or a still GIF) as RGB8, alpha composited on white."""
    try:
        Image = pillow()
    except InvalidRequest as exc:
        raise InvalidRequest(f"{part}: {exc.message}", param=part) from None
    if len(data) > limits.max_bytes:
        raise _bad(part, f"is {len(data)} bytes; at most {limits.max_bytes} are taken")
    # Pillow refuses past twice its limit on open and warns (an error, above) past it; the
    # size is read from the header, so a bomb never allocates its pixels.
    Image.MAX_IMAGE_PIXELS = limits.max_pixels
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _bad(part, f"has more than {limits.max_pixels} pixels") from None
    except Image.UnidentifiedImageError:
        raise _bad(part, "is not an image omlx reads (PNG, JPEG, WebP or GIF)") from None
    # A malformed file makes Pillow raise more than OSError (IndexError, struct.error from
    # a broken GIF, found by fuzzing): every one is the client's bytes, not a 500.
    except Exception as exc:
        raise _bad(part, f"cannot be decoded: {exc}") from None
    with image:
        width, height = image.size
        if width * height > limits.max_pixels:
            raise _bad(part, f"is {width}x{height}, more than {limits.max_pixels} pixels")
        if width < 1 or height < 1:
            raise _bad(part, f"is {width}x{height}: it has no pixels")
        try:
            if getattr(image, "n_frames", 1) > 1:
                raise _bad(part, "is animated; send one still frame")
            image.load()
            return _rgb(image, part)
        except InvalidRequest:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise _bad(part, f"has more than {limits.max_pixels} pixels") from None
        except Exception as exc:  # as on open: whatever a malformed file makes Pillow raise
            reason = "is truncated" if "truncated" in str(exc) else f"cannot be decoded: {exc}"
            raise _bad(part, reason) from None


def _rgb(image, part: str) -> PromptImage:
    from PIL import ImageOps

    # A photo's EXIF orientation, applied as viewers (and transformers' load_image) do.
    image = ImageOps.exif_transpose(image)
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        flat = pillow().new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        image = flat
    elif image.mode != "RGB":
        image = image.convert("RGB")
    return PromptImage.of(image.width, image.height, image.tobytes(), part)


def _bad(part: str, reason: str) -> InvalidRequest:
    return InvalidRequest(f"{part}: the image {reason}", param=part)
