"""Images decoded at the edge: real PNG, JPEG, GIF and WebP files made with Pillow, the
hostile ones refused with a 400 naming the part, and the digest naming pixels, not files."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import random
import struct
import sys
import zlib

import httpx
import pytest
from PIL import Image

from omlx.app.chat.diagnostics import compare, fingerprint
from omlx.app.chat.image_parts import ImageSource, template_content
from omlx.app.chat.image_reader import URLS_OFF, ImageReader
from omlx.app.chat.images import ImageLimits, decode_image
from omlx.app.errors import InvalidRequest
from omlx.domain.images import PromptImage, image_digest

PART = "messages[0].content[1]"


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def picture(width: int = 32, height: int = 24, mode: str = "RGB") -> Image.Image:
    """A picture whose every pixel differs from its neighbours (so a wrong decode shows)."""
    image = Image.new(mode, (width, height))
    channels = len(mode)
    image.putdata(
        [
            tuple((x * 7 + y * 13 + c * 50) % 256 for c in range(channels))
            for y in range(height)
            for x in range(width)
        ]
    )
    return image


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def refused(data: bytes, limits: ImageLimits | None = None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode_image(data, PART, limits or ImageLimits())
    assert caught.value.param == PART
    assert PART in caught.value.message
    return caught.value


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header (valid CRC) claims ``width`` x ``height``, with a few bytes of pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("fmt", "options"),
    [("PNG", {}), ("WEBP", {"lossless": True}), ("GIF", {}), ("JPEG", {"quality": 95})],
)
def test_real_images_decode_to_rgb_rows(fmt, options):
    source = picture(32, 24)
    image = decode_image(encoded(source, fmt, **options), PART, ImageLimits())
    assert (image.width, image.height, image.part) == (32, 24, PART)
    assert len(image.rgb) == 32 * 24 * 3
    assert image.digest == image_digest(32, 24, image.rgb)
    if fmt in ("PNG", "WEBP"):  # lossless: the very pixels
        assert image.rgb == source.tobytes()


def test_the_digest_names_pixels_not_files():
    source = picture(40, 30)
    png = decode_image(encoded(source, "PNG"), "a", ImageLimits())
    webp = decode_image(encoded(source, "WEBP", lossless=True), "b", ImageLimits())
    assert png.digest == webp.digest and png == webp  # compare ignores rgb and part
    # Stable: the v1 recipe, computed by hand.
    import hashlib

    by_hand = hashlib.sha256(
        b"omlx-image-v1\0" + struct.pack("<II", 40, 30) + source.tobytes()
    ).hexdigest()
    assert png.digest == by_hand
    # The size counts: the same bytes as 30 x 40 are another image.
    assert image_digest(30, 40, png.rgb) != png.digest
    other = picture(40, 30)
    other.putpixel((0, 0), (1, 2, 3))
    assert decode_image(encoded(other, "PNG"), "c", ImageLimits()).digest != png.digest


def test_transparency_is_composited_on_white():
    rgba = Image.new("RGBA", (2, 1))
    rgba.putdata([(255, 0, 0, 0), (0, 0, 0, 255)])
    image = decode_image(encoded(rgba, "PNG"), PART, ImageLimits())
    assert image.rgb == bytes([255, 255, 255, 0, 0, 0])


def test_a_truncated_png_is_refused():
    data = encoded(picture(200, 200), "PNG")
    assert "truncated" in refused(data[: len(data) // 2]).message


def test_random_bytes_are_not_an_image():
    assert "not an image" in refused(os.urandom(4096)).message


def test_other_formats_are_refused_by_their_bytes():
    assert "not an image" in refused(encoded(picture(), "BMP")).message


def test_an_animated_gif_is_refused():
    frames = [picture(16, 16), picture(16, 16).rotate(90)]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert "animated" in refused(data).message


def test_a_20000_square_header_is_refused_before_decoding(monkeypatch):
    decoded = []
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self))
    error = refused(png_claiming(20_000, 20_000))
    assert "more than 25000000 pixels" in error.message
    assert decoded == []  # no pixel was ever asked for


def test_past_the_pixel_limit_but_under_pillows_bomb_error():
    # 144 pixels: past a limit of 100, short of twice it (Pillow's warning, not its error).
    error = refused(encoded(picture(12, 12), "PNG"), ImageLimits(max_pixels=100))
    assert "more than 100 pixels" in error.message
    decode_image(encoded(picture(10, 10), "PNG"), PART, ImageLimits(max_pixels=100))


def test_over_the_byte_limit():
    data = encoded(picture(64, 64), "PNG")
    assert "bytes" in refused(data, ImageLimits(max_bytes=len(data) - 1)).message


# ---- reading what the client sent --------------------------------------------------


def read(reader: ImageReader, *urls: str) -> tuple[PromptImage, ...]:
    sources = tuple(ImageSource(f"messages[0].content[{i}]", u) for i, u in enumerate(urls))
    return asyncio.run(reader.read(sources))


def read_refused(reader: ImageReader, *urls: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        read(reader, *urls)
    return caught.value


def test_data_urls_are_read_in_order():
    a, b = encoded(picture(8, 8), "PNG"), encoded(picture(9, 5), "JPEG")
    images = read(ImageReader(), data_url(a), data_url(b, "image/jpeg"))
    assert [(i.width, i.height, i.part) for i in images] == [
        (8, 8, "messages[0].content[0]"),
        (9, 5, "messages[0].content[1]"),
    ]


def test_the_stated_media_type_is_not_trusted():
    png = encoded(picture(8, 8), "PNG")
    assert read(ImageReader(), data_url(png, "image/gif"))[0].width == 8
    error = read_refused(ImageReader(), data_url(b"just some text\n", "image/png"))
    assert "not an image" in error.message and error.param == "messages[0].content[0]"


def test_data_url_shapes_refused():
    assert "base64" in read_refused(ImageReader(), "data:image/png,abc").message
    assert "base64" in read_refused(ImageReader(), "data:image/png;base64,@@@@").message
    big = data_url(os.urandom(3000))
    assert "max_image_bytes" in read_refused(ImageReader(ImageLimits(max_bytes=1000)), big).message


def test_too_many_images():
    png = data_url(encoded(picture(4, 4), "PNG"))
    error = read_refused(ImageReader(ImageLimits(max_images=2)), png, png, png)
    assert "at most 2" in error.message and error.param == "messages[0].content[2]"


def test_urls_are_refused_while_off():
    error = read_refused(ImageReader(), "https://example.com/cat.png")
    assert URLS_OFF in error.message and error.param == "messages[0].content[0]"


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "/etc/passwd"])
def test_other_schemes_are_refused_even_with_urls_on(url):
    error = read_refused(ImageReader(ImageLimits(allow_urls=True)), url)
    assert "data URL or http(s)" in error.message


def serving(handler) -> ImageReader:
    limits = ImageLimits(allow_urls=True, max_bytes=50_000, url_timeout_s=0.5)
    return ImageReader(limits, transport=httpx.MockTransport(handler))


def test_urls_are_fetched_when_on():
    png = encoded(picture(8, 8), "PNG")
    images = read(serving(lambda request: httpx.Response(200, content=png)), "http://h/a.png")
    assert images[0].width == 8


def test_a_fetch_past_the_byte_limit_stops_while_streaming():
    async def endless():
        for _ in range(1000):
            yield b"\0" * 10_000

    reader = serving(lambda request: httpx.Response(200, content=endless()))
    assert "max_image_bytes" in read_refused(reader, "http://h/big").message


def test_a_failed_or_slow_fetch_is_a_400():
    assert "404" in read_refused(serving(lambda r: httpx.Response(404)), "http://h/x").message

    async def slow(request):
        await asyncio.sleep(5)
        return httpx.Response(200)

    assert "did not answer" in read_refused(serving(slow), "http://h/slow").message


# ---- template content and diagnostics ------------------------------------------------


def test_template_content_keeps_text_only_messages_as_strings():
    assert template_content(["a", "b"], "\n") == "a\nb"
    image = ImageSource("p", "data:,")
    assert template_content(["a", "b", image, "c"], "\n") == [
        {"type": "text", "text": "a\nb"},
        {"type": "image"},
        {"type": "text", "text": "c"},
    ]


def test_fingerprints_change_with_the_image_and_only_its_message():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]},
        {"role": "user", "content": "and?"},
    ]
    labels = ["system", "messages[0]", "messages[1]"]
    one = decode_image(encoded(picture(8, 8), "PNG"), "p", ImageLimits())
    other = decode_image(encoded(picture(8, 9), "PNG"), "p", ImageLimits())
    a = fingerprint("m", messages, labels, None, [1, 2, 3], (one,))
    b = fingerprint("m", messages, labels, None, [1, 2, 3], (other,))
    assert compare(a, b).part == "messages[0]"
    assert fingerprint("m", messages, labels, None, [1, 2, 3], (one,)) == a
    # Text only: the very digests as before images were known.
    text = [messages[0], messages[2]]
    assert fingerprint("m", text, labels[::2], None, [1]) == fingerprint(
        "m", text, labels[::2], None, [1], ()
    )


def test_without_pillow_an_image_is_a_400_naming_the_extra(monkeypatch):
    from omlx.app.chat import images

    data = encoded(picture(), "PNG")
    images.pillow.cache_clear()
    monkeypatch.setitem(sys.modules, "PIL", None)
    try:
        error = refused(data)
    finally:
        images.pillow.cache_clear()
    assert "pip install 'omlx[vision]'" in error.message


def test_damaged_files_are_400s_whatever_pillow_raises():
    """Bytes flipped and files cut short at random (a seeded fuzz): only InvalidRequest."""
    rng = random.Random(7)
    base = picture(48, 32, "RGBA")
    frames = [base, base.rotate(90)]
    files = [
        encoded(base, "PNG"),
        encoded(base.convert("RGB"), "JPEG"),
        encoded(base, "WEBP"),
        encoded(base, "GIF"),
        encoded(base, "GIF", save_all=True, append_images=frames[1:]),
    ]
    for _ in range(1500):
        data = bytearray(rng.choice(files))
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        try:
            decode_image(bytes(data), PART, ImageLimits())
        except InvalidRequest as exc:
            assert exc.param == PART
