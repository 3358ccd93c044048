"""Two tenants and an operator on one real server, through the official clients and plain
HTTP: every route and dashboard panel a tenant's key reaches is checked for what tenant B
can see or do with tenant A's data (nothing), and for what the operator can (the server).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.server_process import ServerProcess, free_port
from tests.tenant_keys import ALICE, BOB, OPS, ROOT, keys_file

SECRET = " ".join(f"Rule {i}: the vault code is 4711-{i}." for i in range(40))
CHAT = [
    {"role": "system", "content": SECRET},
    {"role": "user", "content": "Which rule comes first?"},
]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("trust-roles")
    keys = keys_file(work)
    with ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        "--api-key",
        ROOT,
        "--api-keys-file",
        str(keys),
        cache_dir=work / "cache",
        log_path=work / "server.log",
    ) as proc:
        yield proc


def oai(server: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def claude(server: ServerProcess, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=key, max_retries=0)


def http(server: ServerProcess, method: str, path: str, key: str | None, **kw) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, server.base_url + path, headers=headers, timeout=60, **kw)


@pytest.fixture(scope="module")
def alice_was_here(server) -> dict[str, str]:
    """Tenant A's traces on the server: a chat, a stored response, a message, a pin."""
    client = oai(server, ALICE)
    client.chat.completions.create(model="tiny-llama", messages=CHAT, max_tokens=2)
    client.chat.completions.create(
        model="tiny-llama", messages=CHAT, max_tokens=2, extra_body={"prompt_cache_key": "conv-1"}
    )
    response = client.responses.create(model="tiny-llama", input=SECRET, max_output_tokens=4)
    message = claude(server, ALICE).messages.create(
        model="tiny-llama",
        system=SECRET,
        messages=[{"role": "user", "content": "Which rule comes first?"}],
        max_tokens=2,
    )
    pin = http(
        server, "POST", "/v1/cache/pins", ALICE, json={"model": "tiny-llama", "messages": CHAT}
    )
    assert pin.status_code == 201, pin.text
    return {"response": response.id, "message": message.id, "pin": pin.json()["id"]}


def test_b_cannot_read_continue_or_delete_a_s_stored_response(server, alice_was_here) -> None:
    bob = oai(server, BOB)
    rid = alice_was_here["response"]
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(rid)
    with pytest.raises(openai.NotFoundError):
        bob.responses.input_items.list(rid)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        bob.responses.create(
            model="tiny-llama", input="What was the code?", previous_response_id=rid
        )
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(rid)
    assert oai(server, ALICE).responses.retrieve(rid).id == rid  # still A's, whole


def test_b_s_cache_routes_show_nothing_of_a(server, alice_was_here) -> None:
    recent = http(server, "GET", "/v1/cache/recent", BOB).json()["data"]
    assert all(r["tenant"] == "bob" for r in recent)
    assert http(server, "GET", "/v1/cache/pins", BOB).json()["data"] == []
    pin = alice_was_here["pin"]
    assert http(server, "DELETE", f"/v1/cache/pins/{pin}", BOB).status_code == 404
    unpin = http(server, "POST", f"/v1/dashboard/pins/{pin}/unpin", BOB, json={})
    assert unpin.status_code == 404
    explained = http(
        server, "POST", "/v1/cache/explain", BOB, json={"model": "tiny-llama", "messages": CHAT}
    ).json()
    assert explained["cached_tokens"] == 0 and explained["excerpt"]["cached"] == ""
    exported = http(
        server, "POST", "/v1/cache/export", BOB, json={"model": "tiny-llama", "messages": CHAT}
    )
    assert exported.status_code == 400  # B's cache holds none of it
    stats = http(server, "GET", "/v1/cache/stats", BOB).json()
    assert stats["tenant"] == "bob" and "tenants" not in stats
    assert [p["id"] for p in http(server, "GET", "/v1/cache/pins", ALICE).json()["data"]] == [pin]


def test_b_s_dashboard_shows_its_own_requests_and_no_operator_panel(server, alice_was_here) -> None:
    oai(server, BOB).chat.completions.create(model="tiny-llama", messages=CHAT[1:], max_tokens=2)
    state = http(server, "GET", "/v1/dashboard/state", BOB).json()
    assert state["server"]["role"] == "tenant"
    assert state["requests"] and {r["tenant"] for r in state["requests"]} == {"bob"}
    assert state["tiers"] is None
    assert state["pins"] == {"tiny-llama": []}
    assert set(state["models"][0].get("cache", {})) <= {
        "enabled",
        "lookups",
        "lookup_tokens",
        "hit_tokens",
    }
    assert "4711" not in str(state)


def test_b_s_diagnostics_never_compare_with_a_s_messages(server, alice_was_here) -> None:
    bob = claude(server, BOB)
    # A's prompt with the system prompt edited: for A, a "system changed" miss counting A's
    # tokens; for B there is no earlier turn of its own to compare with, and nothing cached.
    edited = bob.messages.create(
        model="tiny-llama",
        system=SECRET.replace("4711-0", "9999-0"),
        messages=[{"role": "user", "content": "Which rule comes first?"}],
        max_tokens=2,
        extra_headers={"anthropic-beta": "cache-diagnosis-2026-04-07"},
    )
    assert edited.usage.cache_read_input_tokens < 16  # none of A's blocks (B's own BOS at most)
    assert edited.model_extra["diagnostics"] == {"cache_miss_reason": None}
    named = bob.messages.create(
        model="tiny-llama",
        system=SECRET,
        messages=[{"role": "user", "content": "Which rule comes first?"}],
        max_tokens=2,
        extra_body={"diagnostics": {"previous_message_id": alice_was_here["message"]}},
    )
    assert named.model_extra["diagnostics"] == {
        "cache_miss_reason": {"type": "previous_message_not_found"}
    }


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/dashboard/models/tiny-llama/unload", {}),
        ("POST", "/v1/dashboard/models/tiny-llama/clear-cache", {}),
        ("POST", "/v1/dashboard/vacuum", {"max_size": "0"}),
        ("GET", "/metrics", None),
    ],
)
def test_b_cannot_act_on_the_whole_server(server, alice_was_here, method, path, body) -> None:
    refused = http(server, method, path, BOB, json=body)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "operator_only"


def test_health_without_a_key_says_ready_and_nothing_more(server) -> None:
    assert http(server, "GET", "/health", None).json() == {
        "status": "ok",
        "server": "omlx",
        "ready": True,
    }
    tenant = http(server, "GET", "/health", BOB).json()
    assert tenant["models"]["tiny-llama"]["state"] == "loaded" and "cache" not in tenant
    assert "restored" in http(server, "GET", "/health", OPS).json()["cache"]


def test_the_operator_sees_the_server_but_not_a_s_prompt(server, alice_was_here) -> None:
    assert http(server, "GET", "/metrics", OPS).status_code == 200
    stats = http(server, "GET", "/v1/cache/stats", OPS).json()
    assert stats["tenants"]["alice"]["tiny-llama"]["lookups"] >= 3
    state = http(server, "GET", "/v1/dashboard/state", OPS).json()
    assert state["server"]["role"] == "operator" and state["tiers"]["hot"]["blocks"] > 0
    assert {"alice", "bob"} <= {r["tenant"] for r in state["requests"]}
    assert "4711" not in str(state["requests"])  # where A's prompts parted: not quoted
    # The root key (--api-key) is an operator too: it clears every tenant's blocks.
    cleared = http(server, "POST", "/v1/dashboard/models/tiny-llama/clear-cache", ROOT, json={})
    assert cleared.status_code == 200 and cleared.json()["hot_blocks"] > 0


def test_keys_file_mistakes_stop_the_server_at_start(tiny_model_dir, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"alice {ROOT}\n")
    serve = [sys.executable, "-m", "omlx", "serve", "--model", str(tiny_model_dir)]
    where = ["--paged-ssd-cache-dir", str(tmp_path / "cache"), "--port", str(free_port())]
    done = subprocess.run(
        [*serve, *where, "--api-key", ROOT, "--api-keys-file", str(keys)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"api_keys_file {keys}, line 1: this key is also --api-key" in done.stderr
    assert "readable by every user" in done.stderr  # written 0644 by write_text
    assert not (tmp_path / "cache").exists()  # stopped before the cache was opened
