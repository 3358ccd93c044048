"""Concurrency through a real server: 429 past the queue, /health while saturated, the memory guard.

``busy_server`` runs the tiny model with two batch slots and one queue place;
``guard_server`` with a KV limit of 1 MB (the tiny model's KV is 512 bytes per token:
at most 1792 tokens per request).
"""

from __future__ import annotations

import concurrent.futures
import json
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.server_process import ServerProcess

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def busy_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("busy-server")
    server = ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        "--max-concurrent-requests",
        "2",
        "--max-queued-requests",
        "1",
        "--prefill-step-size",
        "32",
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def guard_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("guard-server")
    server = ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        "--kv-memory-limit",
        "1MB",
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )
    with server:
        yield server


def body(content: str, max_tokens: int | None = 1900, stream: bool = False) -> dict:
    out = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "stream": stream,
    }
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    return out


class Stream:
    """A streaming chat request read on its own thread, as a real client would."""

    def __init__(self, server: ServerProcess, content: str, max_tokens: int = 1900) -> None:
        self.first = threading.Event()
        self.closed = threading.Event()
        self.status: int | None = None
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._read, args=(server, content, max_tokens), daemon=True
        )
        self._thread.start()

    def _read(self, server: ServerProcess, content: str, max_tokens: int) -> None:
        try:
            with (
                httpx.Client(timeout=60) as client,
                client.stream(
                    "POST",
                    server.base_url + "/v1/chat/completions",
                    json=body(content, max_tokens, stream=True),
                ) as response,
            ):
                self.status = response.status_code
                for line in response.iter_lines():
                    self.lines.append(line)
                    if line.startswith("data:") and _has_text(line[5:]):
                        self.first.set()
                    if self._stop.is_set():
                        return  # leaving the block closes the connection: the server cancels
        finally:
            self.closed.set()

    def close(self) -> None:
        self._stop.set()
        self.closed.wait(30)


def _has_text(data: str) -> bool:
    data = data.strip()
    if not data.startswith("{"):
        return False
    return any((c.get("delta") or {}).get("content") for c in json.loads(data).get("choices") or [])


def health(server: ServerProcess, client: httpx.Client | None = None) -> dict:
    response = (client or httpx).get(server.base_url + "/health", timeout=10)
    assert response.status_code == 200
    return response.json()


def wait_engine(server: ServerProcess, active: int, queued: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        engine = health(server)["engine"]
        if (engine["active"], engine["queued"]) == (active, queued):
            return
        time.sleep(0.02)
    raise AssertionError(
        f"engine never reached active={active} queued={queued}: {health(server)['engine']}"
    )


def saturate(server: ServerProcess) -> list[Stream]:
    """Two streams decoding (about 1900 tokens each) and a third waiting for a slot."""
    streams = [Stream(server, f"Talk about topic {i}") for i in range(3)]
    try:
        wait_engine(server, active=2, queued=1)
        deadline = time.monotonic() + 30
        while sum(s.first.is_set() for s in streams) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(s.first.is_set() for s in streams) == 2, [
            (s.status, s.lines[-3:]) for s in streams
        ]
    except BaseException:
        for s in streams:
            s.close()
        raise
    return streams


def test_queue_limit_gives_429_with_retry_after_and_the_server_recovers(busy_server):
    streams = saturate(busy_server)
    try:
        response = httpx.post(
            busy_server.base_url + "/v1/chat/completions", json=body("One too many", 8), timeout=30
        )
        assert response.status_code == 429
        assert int(response.headers["Retry-After"]) >= 1
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
        sdk = openai.OpenAI(base_url=busy_server.base_url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Me too"}], max_tokens=8
            )
    finally:
        for s in streams:
            s.close()
    wait_engine(busy_server, active=0, queued=0)
    response = httpx.post(
        busy_server.base_url + "/v1/chat/completions", json=body("Back to normal", 8), timeout=60
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 8


def test_health_answers_fast_while_the_engine_is_saturated(busy_server):
    streams = saturate(busy_server)
    try:
        timings = []
        with httpx.Client() as client:
            for _ in range(20):
                t0 = time.perf_counter()
                engine = health(busy_server, client)["engine"]
                timings.append(time.perf_counter() - t0)
                assert engine["active"] == 2
                time.sleep(0.01)
        assert all(not s.closed.is_set() for s in streams), (
            "the streams ended before the timing did"
        )
    finally:
        for s in streams:
            s.close()
    print(
        f"/health while saturated: median {statistics.median(timings) * 1000:.1f} ms, max {max(timings) * 1000:.1f} ms"
    )
    assert statistics.median(timings) < 0.1, timings
    assert sorted(timings)[-2] < 0.1, timings  # one scheduling hiccup of a shared CPU is forgiven
    wait_engine(busy_server, active=0, queued=0)


def test_memory_guard_refuses_a_request_that_could_never_fit(guard_server):
    response = httpx.post(
        guard_server.base_url + "/v1/chat/completions", json=body("Huge", 1900), timeout=30
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "kv_memory_exceeded" and error["param"] == "max_tokens"
    assert "kv_memory_limit" in error["message"] and "1792" in error["message"]
    # Without max_tokens the default is lowered to fit instead.
    long_text = "The quick brown fox jumps over the lazy dog. " * 95
    response = httpx.post(
        guard_server.base_url + "/v1/chat/completions", json=body(long_text, None), timeout=60
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= 1792
    assert usage["completion_tokens"] > 0


def test_four_concurrent_greedy_requests_match_their_solo_text(tiny_server):
    sdk = openai.OpenAI(base_url=tiny_server.base_url + "/v1", api_key="unused", max_retries=0)
    questions = [f"Question {i}: " + "why? " * (3 * i) for i in range(4)]

    def ask(question: str) -> str:
        reply = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            max_tokens=24,
            temperature=0,
        )
        return reply.choices[0].message.content

    solo = [ask(q) for q in questions]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, questions))
    assert together == solo
