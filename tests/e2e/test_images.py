"""Images against a real server of the tiny text model, through the official clients: every
API form answers 400 with the model's refusal and the image's part (not a 500), and a
hostile image is refused naming its part while a small request beside it stays quick."""

from __future__ import annotations

import base64
import io
import struct
import threading
import time
import zlib

import anthropic
import httpx
import openai
import pytest
from PIL import Image

NOT_TAKEN = "does not take images; serve a vision-language model for this request"
SMALL_BOUND_S = 5.0
HOSTILE_CLIENTS = 8


def png_b64(width: int = 8, height: int = 8) -> str:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def bomb_b64() -> str:
    """A PNG whose header (valid CRC) claims 20000 x 20000 pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", 20_000, 20_000, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 99))
    return base64.b64encode(data + chunk(b"IEND", b"")).decode()


def truncated_b64() -> str:
    """A 5000 x 5000 PNG (at the pixel limit) less its last bytes: Pillow decodes nearly all
    of it (a quarter of a second) before the bytes run out."""
    out = io.BytesIO()
    Image.linear_gradient("L").resize((5000, 5000)).convert("RGB").save(out, format="PNG")
    return base64.b64encode(out.getvalue()[:-30]).decode()


@pytest.fixture(scope="module")
def model_id(tiny_server) -> str:
    return httpx.get(tiny_server.base_url + "/v1/models").json()["data"][0]["id"]


def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def anth(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


def anthropic_image(data: str) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def test_openai_chat_image_url(tiny_server, model_id):
    url = "data:image/png;base64," + png_b64()
    with pytest.raises(openai.BadRequestError) as caught:
        oai(tiny_server).chat.completions.create(
            model=model_id,
            messages=[
                {"role": "system", "content": "You describe pictures."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": url, "detail": "auto"}},
                    ],
                },
            ],
            max_tokens=4,
        )
    assert caught.value.status_code == 400
    assert NOT_TAKEN in caught.value.message and f"model {model_id!r}" in caught.value.message
    assert caught.value.param == "messages[1].content[1]"


def test_openai_responses_input_image(tiny_server, model_id):
    url = "data:image/png;base64," + png_b64()
    with pytest.raises(openai.BadRequestError) as caught:
        oai(tiny_server).responses.create(
            model=model_id,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": url, "detail": "auto"},
                    ],
                }
            ],
            max_output_tokens=4,
        )
    assert caught.value.status_code == 400 and NOT_TAKEN in caught.value.message
    assert caught.value.param == "input[0].content[1]"


def test_anthropic_image_block(tiny_server, model_id):
    with pytest.raises(anthropic.BadRequestError) as caught:
        anth(tiny_server).messages.create(
            model=model_id,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        anthropic_image(png_b64()),
                    ],
                }
            ],
        )
    assert caught.value.status_code == 400
    assert NOT_TAKEN in str(caught.value.body)
    assert caught.value.body["type"] == "error"


def test_anthropic_tool_result_image(tiny_server, model_id):
    """Claude Code's Read tool sends a PNG as an image inside a tool_result."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        anth(tiny_server).messages.create(
            model=model_id,
            max_tokens=4,
            messages=[
                {"role": "user", "content": "Read shot.png"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "Read",
                            "input": {"file_path": "shot.png"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [anthropic_image(png_b64())],
                        }
                    ],
                },
            ],
            tools=[{"name": "Read", "input_schema": {"type": "object", "properties": {}}}],
        )
    assert caught.value.status_code == 400 and NOT_TAKEN in str(caught.value.body)


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("bomb", bomb_b64(), "more than 25000000 pixels"),
        ("truncated", truncated_b64(), "truncated"),
    ],
)
def test_a_hostile_image_is_refused_and_a_small_request_beside_it_is_quick(
    tiny_server, model_id, name, data, said
):
    client = oai(tiny_server)
    part = "messages[0].content[0]"
    url = "data:image/png;base64," + data
    results: list = []

    def hostile() -> None:
        try:
            client.chat.completions.create(
                model=model_id,
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
                ],
            )
        except openai.BadRequestError as exc:
            results.append(exc)

    threads = [threading.Thread(target=hostile) for _ in range(HOSTILE_CLIENTS)]
    for thread in threads:
        thread.start()
    latencies = []
    while any(t.is_alive() for t in threads) or not latencies:
        started = time.monotonic()
        answer = client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
        assert answer.choices[0].finish_reason in ("length", "stop")
        latencies.append(time.monotonic() - started)
    for thread in threads:
        thread.join()
    assert len(results) == HOSTILE_CLIENTS
    for exc in results:
        assert exc.status_code == 400 and exc.param == part
        assert said in exc.message and part in exc.message
    print(f"{name}: beside it a 1-token request took at most {max(latencies):.3f} s")
    assert max(latencies) < SMALL_BOUND_S, latencies
