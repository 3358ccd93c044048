"""The SSD tier across restarts and crashes, with real server processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import openai

from tests.server_process import ServerProcess
from tests.storage_checks import assert_cache_invariants

SYSTEM = "You are an agent working on a repository. " * 20


def chat(server: ServerProcess, messages: list[dict], max_tokens: int = 10):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=max_tokens, temperature=0
    )


def two_turns(server: ServerProcess) -> list:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "List the files."},
    ]
    first = chat(server, messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Open the first one."},
    ]
    second = chat(server, messages)
    return [messages, first, second]


def admin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "omlx", "admin", *args], capture_output=True, text=True, timeout=120
    )


def test_restart_restores_from_disk_with_identical_text(tiny_model_dir, tmp_path):
    cache = tmp_path / "cache"
    args = ("--model", str(tiny_model_dir), "--block-size", "16")
    with ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "a.log") as server:
        messages, _, second = two_turns(server)
    # SIGTERM drained the writer: the blocks are on disk and indexed.
    with ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "b.log") as server:
        replay = chat(server, messages)
        health = httpx.get(server.base_url + "/health").json()
    assert replay.choices[0].message.content == second.choices[0].message.content
    cached = replay.usage.prompt_tokens_details.cached_tokens
    # Token-granular: the stored blocks (the last one partial, or full and diverging)
    # give every position but the one left to prefill.
    assert cached == replay.usage.prompt_tokens - 1 > 0
    assert health["cache"]["enabled"]
    assert admin("cache", "verify", "--cache-dir", str(cache)).returncode == 0
    assert_cache_invariants(cache)


def test_second_server_on_the_same_folder_fails_fast(tiny_model_dir, tmp_path):
    cache = tmp_path / "cache"
    with ServerProcess(
        "--model", str(tiny_model_dir), cache_dir=cache, log_path=tmp_path / "a.log"
    ):
        other = subprocess.run(
            [
                sys.executable,
                "-m",
                "omlx",
                "serve",
                "--model",
                str(tiny_model_dir),
                "--port",
                "1",
                "--paged-ssd-cache-dir",
                str(cache),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert other.returncode != 0
    assert "lock" in other.stderr.lower() or "already" in other.stderr.lower()


def test_kill_9_during_a_burst_leaves_a_consistent_cache(tiny_model_dir, tmp_path):
    cache = tmp_path / "cache"
    args = ("--model", str(tiny_model_dir), "--block-size", "16")
    server = ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "a.log").start()
    errors: list[Exception] = []

    def burst(i: int) -> None:
        try:
            chat(
                server,
                [
                    {"role": "system", "content": SYSTEM * 2},
                    {"role": "user", "content": f"task {i} " * (i + 3)},
                ],
                40,
            )
        except Exception as exc:  # the kill ends them
            errors.append(exc)

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    # Kill once some blocks have reached the disk, while requests are still running.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(cache.glob("*/*/*.safetensors")):
        time.sleep(0.05)
    server.kill()
    for t in threads:
        t.join(60)
    with ServerProcess(*args, cache_dir=cache, log_path=tmp_path / "b.log"):
        # start-up reconciles what the crash left behind, beside serving
        deadline = time.monotonic() + 30
        while list(cache.rglob("*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.1)
    verify = admin("cache", "verify", "--cache-dir", str(cache))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not list(cache.rglob("*.tmp"))
    assert_cache_invariants(cache)
