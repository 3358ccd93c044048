"""The real Claude Code CLI against a tiny VLM (issue 35): its Read tool opens a PNG, the
picture goes back to the model inside a ``tool_result``, the session completes, and the
next turn (``--continue``) restores the picture's blocks, after a restart too.

What Claude Code 2.1.332 sends (its request bodies, read while writing this test): the
model name is its own (``claude-opus-5-5``; omlx serves it with its only model, and no
capability or model setting is needed for Claude Code to send pictures); the Read
result is ``{"type": "tool_result", "content": [{"type": "image", "source": {"type":
"base64", "media_type": "image/png", "data": ...}}]}`` holding the file's own bytes when
it is at most 2000 px on a side; a larger picture is resized to fit 2000 px (re-encoded,
as JPEG where PNG would be large) and followed, in the same user turn, by a text block
``[Image: original WxH, displayed at wxh. ...]``. Every later request sends the picture
again, unchanged, in the history.
"""

from __future__ import annotations

import re

import httpx
import numpy as np
import pytest

pytest.importorskip(
    "mlx_vlm",
    reason="the vision extra (pip install -e '.[vision]'; scripts/setup-test.sh installs it)",
)

from PIL import Image, ImageDraw
from tokenizers import Tokenizer

from tests.e2e.agent_cli import ClaudeCode, failed_requests, finished_requests, prompt_and_cached
from tests.scripted_vlm import ANSWER, REPLY, build_scripted_vlm
from tests.server_process import ServerProcess

NOTE = (  # what Claude Code adds after a resized picture
    "[Image: original 2400x1500, displayed at 2000x1250. "
    "Multiply coordinates by 1.20 to map to original image.]"
)


def draw_screenshot(path, width: int, height: int) -> None:
    """A small desktop: a title bar, a window of text lines and a red dot."""
    image = Image.new("RGB", (width, height), (236, 239, 244))
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, width, height // 12], fill=(46, 52, 64))
    draw.rectangle(
        [width // 10, height // 6, width * 6 // 10, height * 5 // 6],
        fill=(255, 255, 255),
        outline=(76, 86, 106),
        width=2,
    )
    for i in range(5):
        draw.text((width // 10 + 8, height // 6 + 8 + 14 * i), f"line {i}", fill=(20, 20, 20))
    draw.ellipse(
        [width * 7 // 10, height // 3, width * 9 // 10, height * 2 // 3], fill=(191, 97, 106)
    )
    image.save(path, format="PNG")


def serve(model, tmp_path, name: str) -> ServerProcess:
    # Warm restart off: the turn after a restart reads the picture's blocks from disk.
    return ServerProcess(
        "--model", str(model), "--log-level", "debug", "--no-warm-restart",
        cache_dir=tmp_path / "cache", log_path=tmp_path / f"{name}.log",
    )  # fmt: skip


def pictures(server, model) -> dict:
    """The VLM's image counters (``/health``): encoder passes and row hits."""
    health = httpx.get(server.base_url + "/health", timeout=10).json()
    return health["models"][model.name]["images"]


def reports(log: str) -> list[str]:
    """Each request's cache report (the debug log's ``x-omlx-cache`` line)."""
    return re.findall(r"cache_controls\.report: cache: (.*)", log)


def test_claude_code_reads_a_png_and_the_next_turn_restores_its_blocks(agent_clis, tmp_path):
    png = tmp_path / "project" / "shot.png"
    png.parent.mkdir(parents=True)
    draw_screenshot(png, 320, 200)
    model = build_scripted_vlm(tmp_path / "model" / "svlm", png)

    with serve(model, tmp_path, "first") as server:
        claude = ClaudeCode(agent_clis, server, tmp_path)
        first = claude.ask("Look at shot.png")
        # The model called Read, Claude Code ran it and sent the picture back: answered.
        assert first["result"] == ANSWER and first["num_turns"] == 2, first
        log = server.read_log()
        (p1, c1), (p2, c2) = finished_requests(log)
        assert p1 > 10_000 and c1 < 64  # a real agent prompt: system prompt, tools, environment
        assert c2 >= p1  # the picture's request restored the call's prompt and the call
        report = reports(log)[-1]
        # New: the picture, named by the first 12 hex digits of its digest.
        assert re.search(r"\[image [0-9a-f]{12}\]", report.split("the prompt goes on", 1)[1]), (
            report
        )
        seen = pictures(server, model)
        assert seen["encoder_passes"] == 1, seen  # the server encoded one picture

        second = claude.ask("--continue", "Which colour dominates?")
        assert second["result"] == REPLY, second
        log = server.read_log()
        p3, c3 = finished_requests(log)[-1]
        # All of the previous request (the picture's 16 tokens included) and its answer.
        assert c3 >= p2 and p3 - c3 < 64, (p2, p3, c3)
        assert prompt_and_cached(second) == (p3, c3)  # what Claude Code was told
        assert pictures(server, model)["encoder_passes"] == 1  # its KV restored, not re-encoded
        assert not failed_requests(log)

    with serve(model, tmp_path, "second") as server:  # the same cache folder, after a restart
        claude.env["ANTHROPIC_BASE_URL"] = server.base_url
        third = claude.ask("--continue", "And the title bar?")
        assert third["result"] == REPLY, third
        log = server.read_log()
        ((p4, c4),) = finished_requests(log)
        assert c4 >= p3 - 64, (p3, p4, c4)  # from the SSD tier, up to its last whole block
        assert "tier=ssd" in reports(log)[-1], reports(log)
        assert pictures(server, model)["encoder_passes"] == 0  # no encoder pass after a restart
        assert not failed_requests(log)
    for name, (prompt, cached) in zip(
        ("read", "picture", "follow-up", "after restart"),
        [(p1, c1), (p2, c2), (p3, c3), (p4, c4)],
        strict=True,
    ):
        print(f"claude code + vlm, {name}: prompt {prompt} tokens, {cached} cached")


def test_a_picture_over_2000_px_comes_resized_with_a_note_and_is_answered(agent_clis, tmp_path):
    """Claude Code resizes it to fit 2000 px and, noise making its PNG large, sends a JPEG
    (of a ``.png`` file) followed by a note in the same turn: still the picture's answer."""
    png = tmp_path / "project" / "shot.png"
    png.parent.mkdir(parents=True)
    noise = np.random.default_rng(0).integers(0, 255, (1500, 2400, 3), dtype=np.uint8)
    Image.fromarray(noise).save(png, format="PNG", compress_level=1)
    model = build_scripted_vlm(tmp_path / "model" / "svlm", png)
    with serve(model, tmp_path, "server") as server:
        claude = ClaudeCode(agent_clis, server, tmp_path)
        first = claude.ask("Look at shot.png")
        assert first["result"] == ANSWER, first
        log = server.read_log()
        (_, _), (p2, c2) = finished_requests(log)
        assert re.search(
            r"\[image [0-9a-f]{12}\]", reports(log)[-1].split("the prompt goes on", 1)[1]
        )
        note = Tokenizer.from_file(str(model / "tokenizer.json")).encode(NOTE).ids
        assert p2 - c2 >= 16 + len(note), (p2, c2)  # the picture's tokens, then the note
        assert pictures(server, model)["encoder_passes"] == 1
        assert not failed_requests(log)
