"""The cache controls against a real ``omlx serve``: no-store on the real index, Claude Code's pins.

No-store is checked on the SQLite index itself (every row's key, recency and hit count),
after the writer and the recency buffer had time to run; the same request stored is the
control that shows the check can fail. The real Claude Code CLI's ``cache_control``
breakpoints are read back as pins, and the debug line names where its next turn diverged.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.cache_header import checked
from tests.e2e.agent_cli import ClaudeCode
from tests.server_process import ServerProcess, side_by_side

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


def rows_when(
    cache_dir: Path, ready: Callable[[list[tuple]], bool], timeout: float = 60.0
) -> list[tuple]:
    """The rows as soon as ``ready`` says so (as they are if ``timeout`` passes first)."""
    deadline = time.monotonic() + timeout
    rows = index_rows(cache_dir)
    while not ready(rows) and time.monotonic() < deadline:
        time.sleep(0.1)
        rows = index_rows(cache_dir)
    return rows


def full_blocks(reply: httpx.Response, block_size: int = 16) -> int:
    """How many whole blocks of its prompt a finished request stores."""
    return reply.json()["usage"]["prompt_tokens"] // block_size


def ask(server: ServerProcess, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": "tiny-llama", "messages": messages, "max_tokens": 4, "temperature": 0, **extra}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_no_store_restores_and_leaves_the_index_unchanged(tiny_model_dir, tmp_path) -> None:
    cache = tmp_path / "cache"
    with ServerProcess(
        "--model", str(tiny_model_dir), "--block-size", "16", cache_dir=cache
    ) as server:
        ask(server, QUESTION)
        before = settled_rows(cache)
        assert before, "the first request stored nothing"
        longer = [
            *QUESTION,
            {"role": "assistant", "content": "Euclid."},
            {"role": "user", "content": "When?"},
        ]
        r = ask(server, longer, omlx_cache_control="no-store")
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16  # restored
        assert r.headers["x-omlx-cache"].endswith("store=no")
        checked(r)
        r = httpx.post(
            server.base_url + "/v1/completions",
            headers={"x-omlx-cache-control": "no-store"},
            json={
                "model": "tiny-llama",
                "prompt": "A different prompt entirely, " * 8,
                "max_tokens": 4,
            },
            timeout=120,
        )
        assert r.status_code == 200
        assert settled_rows(cache) == before
        ask(server, longer)  # the control: stored, it changes the index
        assert rows_when(cache, lambda rows: rows != before) != before


def test_claude_code_cache_control_pins_what_it_marks(
    agent_clis,
    agent_model_dir,
    tmp_path,
) -> None:
    # Its own server: the session's shared agent server must not start out holding this prefix.
    with ServerProcess(
        "--model",
        str(agent_model_dir),
        "--log-level",
        "debug",
        cache_dir=tmp_path / "cache",
        log_path=tmp_path / "server.log",
    ) as server:
        check_claude_code_pins(ClaudeCode(agent_clis, server, tmp_path), server)


def check_claude_code_pins(claude: ClaudeCode, agent_server: ServerProcess) -> None:
    claude.ask("What does this project do?")
    pins = httpx.get(agent_server.base_url + "/v1/cache/pins", timeout=10).json()["data"]
    marked = [p for p in pins if p["source"] == "cache_control"]
    assert marked, pins
    assert all(
        p["expires_at"] - p["created_at"] in (pytest.approx(300), pytest.approx(3600))
        for p in marked
    )
    longest = max(p["tokens"] for p in marked)
    assert longest > 10_000  # the system prompt and tools at least: a real agent prompt
    print(marked)
    # What it marks is cached: every full block (a breakpoint inside a block pins that
    # block's partial key too, which only a prompt ending there would store).
    assert all(p["held_blocks"] >= p["blocks"] - 1 for p in marked)
    claude.ask("--continue", "And where are the tests?")
    lines = re.findall(r"cache: (cached=[^(\n]*?) \(part ", agent_server.read_log())
    assert len(lines) >= 2, lines
    print("\n".join(lines))
    follow = dict(part.split("=", 1) for part in lines[-1].split("; "))
    assert follow["tier"] == "hot" and int(follow["cached"]) > 10_000
    # The new turn, past the answer before it: not the system prompt, not a miss.
    assert follow.get("role") == "user" and follow["outcome"] == "extended", follow


def first_token_seconds(server: ServerProcess, key: str, messages: list[dict]) -> tuple[float, int]:
    """Time to the first streamed token, and the cached tokens the usage reports."""
    body = {
        "model": "tiny-llama",
        "messages": messages,
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, first, cached = time.perf_counter(), None, None
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", server.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=300
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - started
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first is not None and cached is not None
    return first, cached


def test_another_tenants_prompt_is_a_cold_prefill(tiny_model_dir, tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alice sk-alice-0123456789\nbob sk-bob-0123456789\n")
    long_prompt = [
        {"role": "system", "content": " ".join(f"Rule {i}: answer with care." for i in range(70))},
        {"role": "user", "content": "Which rule comes first?"},
    ]
    with ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        "--api-keys-file",
        str(keys),
        cache_dir=tmp_path / "cache",
    ) as server:
        cold, cached_cold = first_token_seconds(server, "sk-alice-0123456789", long_prompt)
        hit, cached_hit = first_token_seconds(server, "sk-alice-0123456789", long_prompt)
        other, cached_other = first_token_seconds(server, "sk-bob-0123456789", long_prompt)
    print(
        f"\ntenant A cold {cold:.3f} s ({cached_cold} cached), A again {hit:.3f} s "
        f"({cached_hit} cached), tenant B {other:.3f} s ({cached_other} cached)"
    )
    assert cached_cold == 0 and cached_hit > 500 and cached_other == 0
    assert other > 1.5 * hit  # B paid the prefill A's hit skipped (measured 2.3-4.5x here)


def admin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omlx", "admin", "cache", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_export_imported_into_a_fresh_server_restores_the_prefix(
    tiny_model_dir, tmp_path
) -> None:
    conversation = [
        {
            "role": "system",
            "content": " ".join(f"Fact {i}: primes are odd past two." for i in range(40)),
        },
        {"role": "user", "content": "Name a prime."},
    ]
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": "tiny-llama", "messages": conversation}))
    archive = tmp_path / "conversation.tar"
    a, b = (
        ServerProcess("--model", str(tiny_model_dir), "--block-size", "16", cache_dir=tmp_path / n)
        for n in ("a", "b")
    )
    # Started together (each on its own folder); b is asked nothing until a has exported.
    with side_by_side(a, b):
        stored = full_blocks(ask(a, conversation))
        rows_when(tmp_path / "a", lambda rows: len(rows) >= stored)  # the writer's, on disk
        done = admin(
            "export", "--messages", str(request), "--out", str(archive), "--url", a.base_url
        )
        assert done.returncode == 0, done.stderr
        print(done.stdout.strip())
        a.stop()
        flipped = tmp_path / "flipped.tar"
        data = bytearray(archive.read_bytes())
        with tarfile.open(archive) as tar:
            block = [m for m in tar.getmembers() if m.name.startswith("blocks/")][-1]
        data[block.offset_data + block.size // 2] ^= 0x01  # one bit inside a block's tensors
        flipped.write_bytes(bytes(data))
        refused = admin("import", str(flipped), "--model", "tiny-llama", "--url", b.base_url)
        assert refused.returncode != 0 and "checksum" in refused.stderr, refused.stderr
        assert index_rows(tmp_path / "b") == []  # nothing entered the index
        done = admin("import", str(archive), "--model", "tiny-llama", "--url", b.base_url)
        assert done.returncode == 0, done.stderr
        print(done.stdout.strip())
        assert len(rows_when(tmp_path / "b", lambda rows: len(rows) >= stored)) >= stored
        r = ask(b, conversation)
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(
        f"fresh server: {cached} of {r.json()['usage']['prompt_tokens']} prompt tokens restored; {r.headers['x-omlx-cache']}"
    )
    assert cached >= r.json()["usage"]["prompt_tokens"] - 16
    assert checked(r)["tier"] == "ssd"  # and the header says what usage does
