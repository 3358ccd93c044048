"""Tenants: a keys file, one cache namespace per tenant on every tier, stats and pins per tenant."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.cache_controls.tenants import KeysFileError, load_keys
from tests.fakes import FakeColdSource
from tests.unit.api_fakes import MODEL, fake_container
from tests.unit.test_cache_header import CachingEngine
from tests.unit.test_prefix_cache import make, seq

PROMPT = [
    {"role": "system", "content": "You review pull requests for a payments service."},
    {"role": "user", "content": "Is this migration safe to run during business hours?"},
]


def test_the_keys_file_is_read_by_line_and_refused_by_line(tmp_path: Path) -> None:
    good = tmp_path / "keys"
    good.write_text("# tenants\nalice  sk-a1  # the first\n\nbob sk-b2\n")
    assert load_keys(good) == {"sk-a1": "alice", "sk-b2": "bob"}
    for text, words in [
        ("alice\n", "line 1: expected 'TENANT KEY'"),
        ("alice sk-1\nbob sk-1\n", "line 2: this key is already tenant 'alice'"),
        ("al/ice sk-1\n", "line 1: a tenant name"),
        ("# nothing\n", "no 'TENANT KEY' lines"),
    ]:
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(KeysFileError, match=words):
            load_keys(bad)
    with pytest.raises(KeysFileError, match="missing"):
        load_keys(tmp_path / "missing")


def test_a_tenant_never_hits_another_tenants_blocks_in_ram_or_on_disk() -> None:
    cold = FakeColdSource()
    pc = make(16, cold=cold)
    tokens = seq(70)
    a = pc.begin(tokens, tenant="alice")
    a.finished(tokens, list(tokens))
    assert pc.begin([*tokens, 1], tenant="alice").cached_tokens == 70
    assert pc.begin([*tokens, 1], tenant="bob").cached_tokens == 0
    assert pc.begin([*tokens, 1]).cached_tokens == 0  # the default tenant is another one too
    pc.hot.clear()
    assert pc.begin([*tokens, 1], tenant="bob").cached_tokens == 0  # nor from disk
    assert pc.begin([*tokens, 1], tenant="alice").cached_tokens == 70
    assert (
        pc.probe([*tokens, 1], "bob").tokens == 0 and pc.probe([*tokens, 1], "alice").tokens == 70
    )
    stored = len(cold.blocks)
    pc.store(tokens, list(tokens))  # the default tenant's own copy: the same tokens, other keys
    assert len(cold.blocks) == 2 * stored == 2 * 5  # 4 full blocks and the partial one each


@pytest.fixture
def tenants(tmp_path: Path) -> tuple[TestClient, CachingEngine]:
    keys = tmp_path / "keys"
    keys.write_text("alice sk-alice\nbob sk-bob\n")
    engine = CachingEngine()
    container = fake_container(engine, api_keys_file=str(keys), api_key="sk-default")
    with TestClient(create_app(container)) as client:
        yield client, engine


def chat(client: TestClient, key: str) -> dict:
    r = client.post(
        "/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": MODEL, "messages": PROMPT},
    )
    assert r.status_code == 200, r.text
    return {"usage": r.json()["usage"], "header": r.headers["x-omlx-cache"]}


def test_over_http_each_key_has_its_own_cache_and_stats(tenants) -> None:
    client, engine = tenants
    assert chat(client, "sk-alice")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    hit = chat(client, "sk-alice")
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] > 50
    other = chat(client, "sk-bob")
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert other["header"].startswith("cached=0; tier=none")
    assert chat(client, "sk-default")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert [r.cache_tenant for r in engine.submitted] == ["alice", "alice", "bob", None]
    stats = client.get("/v1/cache/stats", headers={"x-api-key": "sk-alice"}).json()
    assert stats["tenant"] == "alice"
    assert stats["models"][MODEL]["lookups"] == 2 and stats["models"][MODEL]["cached_tokens"] > 50
    bob = client.get("/v1/cache/stats", headers={"x-api-key": "sk-bob"}).json()
    assert bob["models"][MODEL]["cached_tokens"] == 0
    assert client.get("/v1/cache/stats", headers={"x-api-key": "sk-eve"}).status_code == 401


def test_a_tenant_sees_and_unpins_only_its_own_pins(tenants) -> None:
    client, _ = tenants
    chat(client, "sk-alice")
    alice = {"x-api-key": "sk-alice"}
    pin = client.post(
        "/v1/cache/pins", headers=alice, json={"model": MODEL, "messages": PROMPT}
    ).json()
    assert pin["held_blocks"] == pin["blocks"] - 1 or pin["held_blocks"] == pin["blocks"]
    bob = {"x-api-key": "sk-bob"}
    assert client.get("/v1/cache/pins", headers=bob).json()["data"] == []
    assert client.delete(f"/v1/cache/pins/{pin['id']}", headers=bob).status_code == 404
    assert [p["id"] for p in client.get("/v1/cache/pins", headers=alice).json()["data"]] == [
        pin["id"]
    ]
    explained = client.post(
        "/v1/cache/explain", headers=bob, json={"model": MODEL, "messages": PROMPT}
    )
    assert explained.json()["cached_tokens"] == 0
    assert client.delete(f"/v1/cache/pins/{pin['id']}", headers=alice).json()["deleted"]
