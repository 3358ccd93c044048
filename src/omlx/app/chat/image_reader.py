"""A request's images, read: data URLs decoded, http(s) URLs fetched when the operator
allows it, each decoded off the event loop within the server's limits."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import anyio

from omlx.app.chat.image_parts import ImageSource
from omlx.app.chat.images import NO_PILLOW, ImageLimits, decode_image
from omlx.app.errors import InvalidRequest
from omlx.domain.images import PromptImage

URLS_OFF = (
    "image URLs are off; send the image as a data URL, or start the server with --allow-image-urls"
)


class ImageReader:
    def __init__(self, limits: ImageLimits | None = None, *, transport: Any = None) -> None:
        self.limits = limits or ImageLimits()
        self.transport = transport  # an httpx transport for image URLs (tests); None: the network

    async def read(self, sources: tuple[ImageSource, ...]) -> tuple[PromptImage, ...]:
        """Every image of a request, in order; a 400 naming the first part at fault."""
        limits = self.limits
        if len(sources) > limits.max_images:
            extra = sources[limits.max_images]
            raise InvalidRequest(
                f"{len(sources)} images; at most {limits.max_images} per request "
                "(max_images_per_request)",
                param=extra.part,
            )
        # One by one: a request's images share one thread, so one request cannot take them all.
        return tuple([await self.read_one(source) for source in sources])

    async def read_one(self, source: ImageSource) -> PromptImage:
        url, part = source.url.strip(), source.part
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            return await anyio.to_thread.run_sync(self._decode_data_url, url, part)
        if scheme not in ("http", "https"):
            raise InvalidRequest(
                f"{part}: an image URL must be a data URL or http(s); "
                f"{(scheme + ':') if scheme else 'no scheme'} is not taken",
                param=part,
            )
        if not self.limits.allow_urls:
            raise InvalidRequest(f"{part}: {URLS_OFF}", param=part)
        data = await self._fetch(url, part)
        return await anyio.to_thread.run_sync(decode_image, data, part, self.limits)

    def _decode_data_url(self, url: str, part: str) -> PromptImage:
        header, comma, payload = url.partition(",")
        if not comma or not header.lower().endswith(";base64"):
            raise InvalidRequest(
                f"{part}: a data URL image must be base64 (data:image/png;base64,...)", param=part
            )
        # Checked before decoding: the base64 text is 4/3 of the bytes it holds.
        if len(payload) // 4 * 3 > self.limits.max_bytes + 2:
            raise _too_big(part, self.limits.max_bytes)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{part}: the data URL is not valid base64", param=part) from None
        return decode_image(data, part, self.limits)

    async def _fetch(self, url: str, part: str) -> bytes:
        """The URL's bytes, within the byte limit (enforced while streaming) and the timeout."""
        try:
            import httpx
        except ImportError:
            raise InvalidRequest(f"{part}: {NO_PILLOW}", param=part) from None
        limit = self.limits.max_bytes
        chunks, size = [], 0
        try:
            with anyio.fail_after(self.limits.url_timeout_s):
                async with (
                    httpx.AsyncClient(
                        follow_redirects=True, max_redirects=5, transport=self.transport
                    ) as client,
                    client.stream("GET", url) as response,
                ):
                    if response.status_code != 200:
                        raise InvalidRequest(
                            f"{part}: fetching the image URL answered HTTP {response.status_code}",
                            param=part,
                        )
                    declared = response.headers.get("content-length", "")
                    if declared.isdigit() and int(declared) > limit:
                        raise _too_big(part, limit)
                    async for chunk in response.aiter_bytes():
                        size += len(chunk)
                        if size > limit:
                            raise _too_big(part, limit)
                        chunks.append(chunk)
        except TimeoutError:
            raise InvalidRequest(
                f"{part}: the image URL did not answer within {self.limits.url_timeout_s} s "
                "(image_url_timeout_s)",
                param=part,
            ) from None
        except httpx.HTTPError as exc:
            raise InvalidRequest(
                f"{part}: the image URL could not be fetched: {exc}", param=part
            ) from None
        return b"".join(chunks)


def _too_big(part: str, limit: int) -> InvalidRequest:
    return InvalidRequest(f"{part}: the image is over {limit} bytes (max_image_bytes)", param=part)
