"""Warm restart with real server processes: yesterday's conversation resumes from RAM."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cache_header import checked
from tests.server_process import ServerProcess
from tests.storage_checks import assert_cache_invariants

SYSTEM = "You are an agent working on a repository. " * 20
MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "List the files."},
]


def ask(server: ServerProcess) -> httpx.Response:
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    r.raise_for_status()
    return r


def warm_restart(server: ServerProcess, timeout: float = 60.0) -> dict:
    """The model's warm restart on /health, once it is no longer running."""
    deadline = time.monotonic() + timeout
    while True:
        warm = httpx.get(server.base_url + "/health").json()["cache"]["warm_restart"]
        if warm["state"] != "running" or time.monotonic() > deadline:
            return warm
        time.sleep(0.1)


def metrics(server: ServerProcess) -> str:
    return httpx.get(server.base_url + "/metrics").text


def test_the_first_turn_after_a_restart_is_a_ram_hit(tiny_model_dir, tmp_path):
    cache = tmp_path / "cache"
    args = ("--model", str(tiny_model_dir), "--block-size", "16")
    with ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "a.log") as server:
        first = ask(server)
        assert checked(first)["tier"] == "none"
    hot_sets = list((cache / ".hot-sets").glob("*.json"))
    assert len(hot_sets) == 1  # recorded at the clean shutdown
    recorded = json.loads(hot_sets[0].read_text())["entries"]

    with ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "b.log") as server:
        warm = warm_restart(server)
        assert warm["state"] == "done", warm
        assert warm["blocks"] == warm["blocks_total"] == len(recorded) > 0
        assert warm["bytes"] == warm["bytes_total"] > 0 and warm["skipped"] == 0
        replay = ask(server)
        report = replay.headers["x-omlx-cache"]
        assert checked(replay)["tier"] == "hot", report  # the primed kept cache, as usage says
        log_text = server.log_once_it_has("cached (a kept cache)")
        # Primed before /health said done; the replay continued that kept cache.
        assert "the latest conversation (" in log_text and "kept for its next turn" in log_text
        assert "cached (a kept cache)" in log_text, log_text[-2000:]
        prompt = replay.json()["usage"]["prompt_tokens"]
        assert replay.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1
        assert replay.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
        text = metrics(server)
        assert f'omlx_warm_restart_blocks{{model="tiny-llama",what="read"}} {len(recorded)}' in text
        assert 'omlx_warm_restart_running{model="tiny-llama"} 0.0' in text
    stats = subprocess.run(
        [sys.executable, "-m", "omlx", "admin", "cache", "stats", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "hot set: " in stats.stdout, stats.stdout

    with ServerProcess(
        *args, "--no-warm-restart", cache_dir=cache, log_path=tmp_path / "c.log"
    ) as server:
        assert warm_restart(server) == {"state": "off"}
        reply = ask(server)
        assert checked(reply)["tier"] == "ssd", reply.headers["x-omlx-cache"]
    assert_cache_invariants(cache)


@pytest.mark.slow  # two more starts; the default run keeps the clean-stop test
def test_a_crash_after_the_periodic_record_still_prefetches(tiny_model_dir, tmp_path: Path):
    cache = tmp_path / "cache"
    args = ("--model", str(tiny_model_dir), "--block-size", "16")
    env = {"OMLX_WARM_RESTART_RECORD_SECONDS": "0.5"}
    server = ServerProcess(*args, cache_dir=cache, env=env, log_path=tmp_path / "a.log").start()
    try:
        ask(server)
        deadline = time.monotonic() + 30
        while not list((cache / ".hot-sets").glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the writer's blocks reach the disk (write-through, asynchronous)
    finally:
        server.kill()  # SIGKILL: no shutdown record, no drain
    with ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "b.log") as server:
        warm = warm_restart(server)
        assert warm["state"] == "done" and warm["blocks"] > 0, warm
        reply = ask(server)
        assert checked(reply)["tier"] == "hot", reply.headers["x-omlx-cache"]
