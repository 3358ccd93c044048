"""A hostile or careless client against a real server (issue 22): every hostile body is a
4xx in its route's envelope, quickly; a small request running beside it is not held up;
refused prompts do not grow the server's memory."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

BIG = "word " * 2_000_000  # 10 MB of text, under the 16 MB body limit
SMALL_BOUND_S = 3.0  # a 1-token completion of the tiny model takes ~0.05-0.3 s here


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def anyof(n: int) -> dict:
    return {
        "anyOf": [
            {"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
            for i in range(n)
        ]
    }


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


HI = [{"role": "user", "content": "hi"}]
HOSTILE: list[tuple[str, str, str | dict, int, str]] = [
    (
        "chat 10 MB",
        "/v1/chat/completions",
        {"model": "chat", "messages": [{"role": "user", "content": BIG}]},
        400,
        "characters",
    ),
    ("completion 10 MB", "/v1/completions", {"model": "chat", "prompt": BIG}, 400, "characters"),
    (
        "messages 10 MB",
        "/v1/messages",
        {"model": "chat", "max_tokens": 1, "messages": [{"role": "user", "content": BIG}]},
        400,
        "characters",
    ),
    (
        "count_tokens 10 MB",
        "/v1/messages/count_tokens",
        {"model": "chat", "messages": [{"role": "user", "content": BIG}]},
        400,
        "characters",
    ),
    ("responses 10 MB", "/v1/responses", {"model": "chat", "input": BIG}, 400, "characters"),
    ("embeddings 10 MB", "/v1/embeddings", {"model": "emb", "input": BIG}, 400, "characters"),
    (
        "rerank 10 MB",
        "/v1/rerank",
        {"model": "rr", "query": "q", "documents": [BIG]},
        400,
        "characters",
    ),
    (
        "nested 100k",
        "/v1/chat/completions",
        f'{{"model": "chat", "messages": [], "metadata": {{"x": {deep(100_000)}}}}}',
        400,
        "nested too deeply",
    ),
    (
        "nested 1000 anthropic",
        "/v1/messages",
        f'{{"model": "chat", "max_tokens": 1, "messages": [], "metadata": {deep(1000)}}}',
        400,
        "nested too deeply",
    ),
    (
        "anyOf 3000",
        "/v1/chat/completions",
        {
            "model": "chat",
            "messages": HI,
            "max_tokens": 4,
            "response_format": schema_format(anyof(3000)),
        },
        400,
        "too large",
    ),
    (
        "$ref to itself",
        "/v1/chat/completions",
        {
            "model": "chat",
            "messages": HI,
            "max_tokens": 4,
            "response_format": schema_format({"$ref": "#"}),
        },
        400,
        "refers only to itself",
    ),
    (
        "$ref to each other",
        "/v1/chat/completions",
        {
            "model": "chat",
            "messages": HI,
            "max_tokens": 4,
            "response_format": schema_format(
                {
                    "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                    "$ref": "#/$defs/a",
                }
            ),
        },
        400,
        "refers only to itself",
    ),
    (
        "max_tokens string",
        "/v1/chat/completions",
        {"model": "chat", "messages": HI, "max_tokens": "5"},
        400,
        "max_tokens",
    ),
    (
        "metadata 3.6 MB",
        "/v1/responses",
        {
            "model": "chat",
            "input": "hi",
            "max_output_tokens": 2,
            "metadata": {"k": "v" * 3_600_000},
        },
        400,
        "metadata",
    ),
]


def post(base: str, path: str, body: str | dict, timeout: float = 120) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(
        base + path, content=content, headers={"content-type": "application/json"}, timeout=timeout
    )


def small(base: str) -> float:
    started = time.monotonic()
    r = httpx.post(
        base + "/v1/completions",
        json={"model": "chat", "prompt": "Hello", "max_tokens": 1},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return time.monotonic() - started


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    ("name", "path", "body", "status", "said"), HOSTILE, ids=[h[0] for h in HOSTILE]
)
def test_a_hostile_body_is_refused_quickly_and_a_small_request_beside_it_is_not_held_up(
    all_tasks_server, name, path, body, status, said
):
    base = all_tasks_server.base_url
    small(base)  # warm
    result: dict = {}

    def hostile() -> None:
        started = time.monotonic()
        result["response"] = post(base, path, body)
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=hostile)
    thread.start()
    latencies = []
    while thread.is_alive():
        latencies.append(small(base))
    thread.join()
    latencies.append(small(base))
    r = result["response"]
    assert r.status_code == status, r.text[:500]
    error = r.json()["error"]
    assert said in error["message"], error
    if path.startswith("/v1/messages"):
        assert r.json()["type"] == "error"
    print(
        f"{name}: refused in {result['seconds']:.3f} s; beside it a 1-token request took at most {max(latencies):.3f} s"
    )
    assert result["seconds"] < 10
    assert max(latencies) < SMALL_BOUND_S, latencies


def test_refused_prompts_do_not_grow_memory(all_tasks_server):
    base = all_tasks_server.base_url
    pid = all_tasks_server.proc.pid
    body = {"model": "chat", "messages": [{"role": "user", "content": BIG}]}
    for _ in range(2):  # the first ones allocate what a body of this size needs, once
        post(base, "/v1/chat/completions", body)
    time.sleep(0.5)
    before = rss_mb(pid)
    for _ in range(5):
        assert post(base, "/v1/chat/completions", body).status_code == 400
    time.sleep(0.5)  # the middleware releases once the response is out
    after = rss_mb(pid)
    print(f"RSS around five refused 10 MB prompts: {before:.0f} MB -> {after:.0f} MB")
    assert after - before < 60, (before, after)  # without the release: +230 MB and rising
