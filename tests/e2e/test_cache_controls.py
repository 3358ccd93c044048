"""The cache controls against a real ``omlx serve``: no-store on the real index, Claude Code's pins.

No-store is checked on the SQLite index itself (every row's key, recency and hit count),
after the writer and the recency buffer had time to run; the same request stored is the
control that shows the check can fail. The real Claude Code CLI's ``cache_control``
breakpoints are read back as pins, and the debug line names where its next turn diverged.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_agent_clis import ClaudeCode, agent_clis  # noqa: F401 (fixture)
from tests.server_process import ServerProcess

QUESTION = [
    {"role": "system", "content": "You answer questions about the history of mathematics."},
    {"role": "user", "content": "Who first proved that there are infinitely many primes?"},
]


def index_rows(cache_dir: Path) -> list[tuple]:
    with sqlite3.connect(f"file:{cache_dir / 'index.db'}?mode=ro", uri=True) as db:
        return sorted(db.execute("SELECT key, last_access, hit_count FROM blocks").fetchall())


def settled_rows(cache_dir: Path, quiet: float = 7.0) -> list[tuple]:
    """The rows once they stopped changing for ``quiet`` seconds (writer, recency flush: 5 s)."""
    rows, since = index_rows(cache_dir), time.monotonic()
    while time.monotonic() - since < quiet:
        time.sleep(0.5)
        now = index_rows(cache_dir)
        if now != rows:
            rows, since = now, time.monotonic()
    return rows


def ask(server: ServerProcess, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": "tiny-llama", "messages": messages, "max_tokens": 4, "temperature": 0, **extra}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_no_store_restores_and_leaves_the_index_unchanged(tiny_model_dir, tmp_path) -> None:
    cache = tmp_path / "cache"
    with ServerProcess("--model", str(tiny_model_dir), "--block-size", "16", cache_dir=cache) as server:
        ask(server, QUESTION)
        before = settled_rows(cache)
        assert before, "the first request stored nothing"
        longer = [*QUESTION, {"role": "assistant", "content": "Euclid."}, {"role": "user", "content": "When?"}]
        r = ask(server, longer, omlx_cache_control="no-store")
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16  # restored
        assert r.headers["x-omlx-cache"].endswith("store=no")
        r = httpx.post(
            server.base_url + "/v1/completions",
            headers={"x-omlx-cache-control": "no-store"},
            json={"model": "tiny-llama", "prompt": "A different prompt entirely, " * 8, "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200
        assert settled_rows(cache) == before
        ask(server, longer)  # the control: stored, it changes the index
        assert settled_rows(cache) != before


def test_claude_code_cache_control_pins_what_it_marks(agent_clis, agent_server, tmp_path) -> None:  # noqa: F811
    claude = ClaudeCode(agent_clis, agent_server, tmp_path)
    claude.ask("What does this project do?")
    pins = httpx.get(agent_server.base_url + "/v1/cache/pins", timeout=10).json()["data"]
    marked = [p for p in pins if p["source"] == "cache_control"]
    assert marked, pins
    assert all(p["expires_at"] - p["created_at"] in (pytest.approx(300), pytest.approx(3600)) for p in marked)
    longest = max(p["tokens"] for p in marked)
    assert longest > 10_000  # the system prompt and tools at least: a real agent prompt
    print(marked)
    # What it marks is cached: every full block (a breakpoint inside a block pins that
    # block's partial key too, which only a prompt ending there would store).
    assert all(p["held_blocks"] >= p["blocks"] - 1 for p in marked)
    claude.ask("--continue", "And where are the tests?")
    lines = re.findall(r"cache: (cached=\d+; tier=\w+(?:; diverged_at=\d+; message=\d+; role=\w+)?)", agent_server.read_log())
    assert len(lines) >= 2, lines
    print("\n".join(lines))
    follow = dict(part.split("=", 1) for part in lines[-1].split("; "))
    assert follow["tier"] == "hot" and int(follow["cached"]) > 10_000
    assert follow.get("role") in ("user", "assistant"), follow  # the new turn, not the system prompt
