"""Many models behind one real server: a model dir of two chat models, an embedding model and
a reranker; loads on demand, unloads under a memory limit, pins, and the SSD tier across."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.encoder_models import build_embedding_model, build_rerank_model
from tests.server_process import ServerProcess
from tests.tiny_model import build_tiny_model

SYSTEM = "You are a careful coding assistant. " * 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    build_tiny_model(root / "chat-a", seed=1)
    build_tiny_model(root / "team" / "chat-b", seed=2)  # found in a subfolder too
    build_embedding_model(root / "emb")
    build_rerank_model(root / "rr")
    return root


def weights(folder: Path) -> int:
    return (folder / "model.safetensors").stat().st_size


def serve(model_dir: Path, work: Path, *extra: str) -> ServerProcess:
    # Room for one chat model and its KV, not two: a second one unloads the first.
    limit = int(1.6 * weights(model_dir / "chat-a"))
    return ServerProcess(
        "--model-dir",
        str(model_dir),
        "--max-model-memory",
        str(limit),
        "--block-size",
        "16",
        *extra,
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )


def states(server: ServerProcess) -> dict[str, str]:
    cards = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"]
    return {c["id"]: c.get("state") for c in cards if "alias_of" not in c}


def chat(client: OpenAI, model: str, messages: list[dict]):
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0
    )


def test_models_load_on_demand_and_make_room_for_each_other(model_dir, tmp_path):
    with serve(model_dir, tmp_path) as server:
        client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        assert states(server) == {
            "chat-a": "available",
            "chat-b": "available",
            "emb": "available",
            "rr": "available",
        }
        ask = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there."}]
        replies: list = []
        threads = [
            threading.Thread(target=lambda: replies.append(chat(client, "chat-a", ask)))
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(replies) == 3 and len({r.choices[0].message.content for r in replies}) == 1
        first = replies[0]
        assert states(server)["chat-a"] == "loaded"

        other = chat(client, "chat-b", [{"role": "user", "content": "Hi"}])  # no room for both
        assert other.choices[0].message.content
        assert states(server) == {
            "chat-a": "available",
            "chat-b": "loaded",
            "emb": "available",
            "rr": "available",
        }

        follow = [
            *ask,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And again?"},
        ]
        again = chat(client, "chat-a", follow)  # reloaded: its prefix comes back from the SSD tier
        assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1

        emb = client.embeddings.create(model="emb", input=["Paris", "The quick brown fox."])
        assert [len(d.embedding) for d in emb.data] == [64, 64] and [d.index for d in emb.data] == [
            0,
            1,
        ]
        assert abs(math.sqrt(sum(x * x for x in emb.data[0].embedding)) - 1) < 1e-4
        ranked = httpx.post(
            server.base_url + "/v1/rerank",
            json={
                "model": "rr",
                "query": "capital?",
                "documents": ["Paris", "fox"],
                "return_documents": True,
            },
            timeout=60,
        ).json()
        assert sorted(r["index"] for r in ranked["results"]) == [0, 1]
        assert {r["document"]["text"] for r in ranked["results"]} == {"Paris", "fox"}
        wrong = httpx.post(
            server.base_url + "/v1/embeddings", json={"model": "chat-a", "input": "x"}, timeout=30
        )
        assert wrong.status_code == 400 and "chat model" in wrong.json()["error"]["message"]
        health = httpx.get(server.base_url + "/health", timeout=10).json()
        log = server.read_log()
    assert health["memory"]["held"] <= health["memory"]["max_model_memory"]
    assert (
        len(re.findall(r"loading chat-a \(chat\)", log)) == 2
    )  # once at first, once after the unload
    assert "unloading chat-a (least recently used) to make room for chat-b" in log


def test_a_pinned_model_is_never_unloaded(model_dir, tmp_path):
    with serve(model_dir, tmp_path, "--pin-model", "chat-a") as server:
        assert states(server)["chat-a"] == "loaded"  # pinned: loaded at start
        r = httpx.post(
            server.base_url + "/v1/chat/completions",
            json={
                "model": "chat-b",
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
            },
            timeout=60,
        )
        assert r.status_code == 429 and "max_model_memory" in r.json()["error"]["message"]
        assert r.headers["retry-after"]
        assert states(server)["chat-a"] == "loaded"


def test_the_port_opens_before_the_model_named_at_start_has_loaded(model_dir, tmp_path):
    server = ServerProcess("--model", str(model_dir / "chat-a"), cache_dir=tmp_path / "cache")
    server.proc = subprocess.Popen(  # started by hand: ServerProcess.start waits for "ready"
        [
            sys.executable,
            "-m",
            "omlx",
            "serve",
            "--port",
            str(server.port),
            "--model",
            str(model_dir / "chat-a"),
            "--paged-ssd-cache-dir",
            str(tmp_path / "cache"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        seen: list[tuple[bool, str]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (seen and seen[-1][0]):
            try:
                health = httpx.get(server.base_url + "/health", timeout=1).json()
                # Before the app is up the port answers alone: what it waits for, no models.
                state = health["models"]["chat-a"]["state"] if "models" in health else "starting"
                seen.append((health["ready"], state))
                if not health["ready"]:
                    assert health["waiting_for"], health
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        assert seen[-1] == (True, "loaded")
        # The first answer came while the model was still loading (importing mlx-lm
        # alone takes longer than a poll).
        assert seen[0][0] is False and seen[0][1] in ("starting", "loading", "available")
    finally:
        server.kill()


def test_a_model_that_fails_to_load_is_a_503_naming_its_file(tmp_path):
    broken = tmp_path / "models" / "broken.gguf"
    broken.parent.mkdir()
    broken.write_bytes(b"not a gguf file at all")
    with ServerProcess(
        "--model", str(broken), cache_dir=tmp_path / "cache", log_path=tmp_path / "server.log"
    ) as server:
        health = httpx.get(server.base_url + "/health", timeout=10).json()
        assert (
            health["models"]["broken"]["state"] == "available"
            and "broken.gguf" in health["models"]["broken"]["error"]
        )
        r = httpx.post(
            server.base_url + "/v1/chat/completions",
            json={"model": "broken", "messages": [{"role": "user", "content": "Hi"}]},
            timeout=60,
        )
        assert r.status_code == 503 and "broken.gguf" in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "model_load_failed"
