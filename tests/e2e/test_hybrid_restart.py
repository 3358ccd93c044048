"""Hybrid and sliding-window models through real server processes: a conversation, then a
full restart, then its replay and its next turn restored from disk, as a dense model's are."""

from __future__ import annotations

import pytest
from openai import OpenAI

from tests.cache_header import checked
from tests.hybrid_models import build_hybrid_model
from tests.server_process import ServerProcess, side_by_side

SYSTEM = "You are a careful coding assistant. " * 12
TURNS = ["Write a function that adds two numbers.", "Now make it subtract."]


@pytest.fixture(scope="module", params=["qwen3_next", "gemma3_text", "falcon_h1"])
def family(request, tmp_path_factory):
    return request.param, build_hybrid_model(
        request.param, tmp_path_factory.mktemp(request.param) / request.param
    )


def serve(model, work, *extra: str) -> ServerProcess:
    work.mkdir(parents=True, exist_ok=True)
    return ServerProcess(
        "--model",
        str(model),
        "--block-size",
        "16",
        "--prefill-step-size",
        "64",
        *extra,
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )


def ask(server: ServerProcess, model_id: str, messages: list[dict]) -> tuple[str, int, int]:
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=model_id, messages=messages, max_tokens=12, temperature=0
    )
    r = raw.parse()
    if "--no-cache" not in server.args:
        checked(raw)  # from disk and at a restore point, the header says what usage does
    return (
        r.choices[0].message.content,
        r.usage.prompt_tokens,
        r.usage.prompt_tokens_details.cached_tokens,
    )


def conversation(server: ServerProcess, model_id: str, replies: list[str] | None = None):
    """Both turns; with ``replies``, each turn's history uses those (a replay of a conversation)."""
    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for i, user in enumerate(TURNS):
        messages.append({"role": "user", "content": user})
        text, prompt, cached = ask(server, model_id, messages)
        out.append((text, prompt, cached))
        messages.append({"role": "assistant", "content": replies[i] if replies else text})
    return out


def test_a_conversation_is_restored_from_disk_after_a_restart(family, tmp_path):
    name, model = family
    plain, first = serve(model, tmp_path / "plain", "--no-cache"), serve(model, tmp_path / "cached")
    with side_by_side(plain, first):  # two folders, one request at a time: nothing shared
        want = conversation(plain, name)
        before = conversation(first, name)
    with serve(model, tmp_path / "cached") as second:  # a fresh process on the same folder
        after = conversation(second, name, replies=[t for t, _, _ in want])
        log = second.read_log()
    assert [t for t, _, _ in before] == [t for t, _, _ in want]
    assert [t for t, _, _ in after] == [t for t, _, _ in want]
    (_, p1, _), (_, p2, _) = before
    (_, r1, c1), (_, r2, c2) = after
    assert (r1, r2) == (p1, p2)
    assert c1 >= 0.9 * p1, (c1, p1)  # the replayed first turn, from disk
    assert c2 >= 0.9 * p2, (c2, p2)  # the second turn: its own earlier prompt and answer
    assert before[1][2] >= 0.9 * p1  # and in the first process, the follow-up
    assert f"prefix cache of {name}: hot tier" in log and f"prefix cache of {name}: off" not in log
