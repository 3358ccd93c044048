"""Prefill survives the client leaving and the server dying: real processes, real clients.

A client that times out mid-prefill, and a ``kill -9`` mid-prefill, keep every chunk
that completed (what reached disk, for the crash): the retry restores it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess
from tests.tiny_model import build_tiny_model

BLOCK, STEP = 16, 64
PROMPT = [(7 * i) % 290 + 3 for i in range(2000)]


@pytest.fixture(scope="module")
def deep_tiny(tmp_path_factory) -> Path:
    """Eight layers: a 2,000-token prefill takes a couple of seconds here, time to leave in."""
    return build_tiny_model(tmp_path_factory.mktemp("deep-tiny") / "deep-tiny", layers=8)


def server(model: Path, work: Path) -> ServerProcess:
    return ServerProcess(
        "--model",
        str(model),
        "--block-size",
        str(BLOCK),
        "--prefill-step-size",
        str(STEP),
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )


def complete(base_url: str, timeout: float) -> dict:
    body = {"model": "deep-tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    return httpx.post(base_url + "/v1/completions", json=body, timeout=timeout).json()


def kv_rows(cache_dir: Path) -> int:
    with sqlite3.connect(cache_dir / "index.db") as db:
        return db.execute("SELECT COUNT(*) FROM blocks WHERE kind = 'kv'").fetchone()[0]


def test_a_client_that_times_out_mid_prefill_gets_its_work_back_on_retry(deep_tiny, tmp_path):
    with server(deep_tiny, tmp_path) as s:
        with pytest.raises(httpx.TimeoutException):
            complete(s.base_url, timeout=0.8)
        time.sleep(0.5)  # the server notices the disconnect within a step and keeps its chunks
        retry = complete(s.base_url, timeout=120)
    cached = retry["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 4 * STEP, retry["usage"]  # several chunks were done when the client left
    assert cached < len(PROMPT) - 1  # and not all: the work was really cut short


def test_kill_9_mid_prefill_then_restart_restores_what_reached_disk(deep_tiny, tmp_path):
    s = server(deep_tiny, tmp_path).start()
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["reply"] = complete(s.base_url, timeout=120)
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    asker = threading.Thread(target=ask)
    asker.start()
    deadline = time.monotonic() + 60
    while kv_rows(s.cache_dir) < 8:
        assert "reply" not in outcome, "the prefill ended before the test could kill the server"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.kill()
    asker.join(30)
    on_disk = kv_rows(s.cache_dir)
    assert "error" in outcome and 8 <= on_disk < len(PROMPT) // BLOCK
    again = server(deep_tiny, tmp_path)
    with again:
        retry = complete(again.base_url, timeout=120)
    # The writer records blocks in the order they were cut: the rows are a prefix of the chain.
    assert retry["usage"]["prompt_tokens_details"]["cached_tokens"] >= on_disk * BLOCK
