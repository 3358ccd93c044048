"""``--kv-bits`` across restarts, with real server processes: quantized blocks restored from
disk, a changed setting starting a fresh namespace that shares no block with the old one."""

from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest

from tests.server_process import ServerProcess
from tests.storage_checks import assert_cache_invariants
from tests.tiny_model import build_tiny_model

SYSTEM = "You are an agent working on a repository. " * 20


@pytest.fixture(scope="module")
def wide_tiny(tmp_path_factory):
    """A tiny llama whose head_dim (32) a quantization group divides."""
    return build_tiny_model(tmp_path_factory.mktemp("wide") / "tiny-llama", hidden_size=128)


def chat(server: ServerProcess, messages: list[dict], max_tokens: int = 12):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    return client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=max_tokens, temperature=0
    )


def stats(cache) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "omlx",
            "admin",
            "cache",
            "stats",
            "--json",
            "--cache-dir",
            str(cache),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {ns["kv_dtype"]: ns for ns in json.loads(out.stdout)["namespaces"]}


def test_quantized_blocks_restore_after_a_restart_and_a_changed_setting_starts_fresh(
    wide_tiny, tmp_path
):
    cache = tmp_path / "cache"
    base = ("--model", str(wide_tiny), "--block-size", "16")
    eight = (*base, "--kv-bits", "8", "--kv-group-size", "32")
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "List the files."},
    ]
    with ServerProcess(*eight, cache_dir=cache, log_path=tmp_path / "a.log") as server:
        miss = chat(server, messages)
    assert miss.usage.prompt_tokens_details.cached_tokens == 0
    with ServerProcess(*eight, cache_dir=cache, log_path=tmp_path / "b.log") as server:
        hit = chat(server, messages)
    # Every position but the last restored from the quantized files on disk.
    assert hit.usage.prompt_tokens_details.cached_tokens == hit.usage.prompt_tokens - 1 > 0
    # Store-only: the restored prefix is dequantized; on this model the greedy text holds.
    assert hit.choices[0].message.content == miss.choices[0].message.content
    by_dtype = stats(cache)
    assert set(by_dtype) == {"q8g32/float32"}

    # The same prompt with the setting off: a fresh namespace, nothing borrowed from 8-bit.
    with ServerProcess(*base, cache_dir=cache, log_path=tmp_path / "c.log") as server:
        plain = chat(server, messages)
    assert plain.usage.prompt_tokens_details.cached_tokens == 0
    by_dtype = stats(cache)
    assert set(by_dtype) == {"q8g32/float32", "float32"}
    q8, off = by_dtype["q8g32/float32"], by_dtype["float32"]
    assert q8["namespace"] != off["namespace"] and q8["tokens"] == off["tokens"]
    # On disk, per token, files whole: 8-bit codes plus float16 scales are 0.28x the KV
    # (tests/integration/test_kv_codec_quantized.py); each 16-token file's header (~50 bytes
    # a token on this 2-layer model) adds the rest.
    assert q8["bytes_per_token"] <= 0.4 * off["bytes_per_token"]
    assert_cache_invariants(cache)
