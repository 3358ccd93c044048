"""Tenants: a keys file, one cache namespace per tenant on every tier, stats and pins per tenant."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.cache_controls.tenants import MIN_KEY_CHARS, Caller, KeysFileError, load_keys
from tests.cache_header import checked
from tests.fakes import FakeColdSource
from tests.tenant_keys import ALICE, BOB, OPS
from tests.unit.api_fakes import MODEL, fake_container
from tests.unit.test_cache_header import CachingEngine
from tests.unit.test_prefix_cache import make, seq

PROMPT = [
    {"role": "system", "content": "You review pull requests for a payments service."},
    {"role": "user", "content": "Is this migration safe to run during business hours?"},
]


def test_the_keys_file_is_read_by_whole_lines_and_refused_by_line(tmp_path: Path) -> None:
    good = tmp_path / "keys"
    good.write_text(
        f"# tenants\n  # indented comment\nalice  {ALICE}\n\nbob sk-b#2-0123456789 tenant\n"
        f"ops {OPS} operator\n"
    )
    good.chmod(0o600)
    assert load_keys(good) == {
        ALICE: Caller("alice", operator=False),
        "sk-b#2-0123456789": Caller("bob", operator=False),  # '#' inside a key is the key's
        OPS: Caller("ops", operator=True),
    }
    for text, words in [
        ("alice\n", "line 1: expected 'TENANT KEY"),
        (f"alice {ALICE}  # note\n", "line 1: expected 'TENANT KEY"),  # no trailing comments
        (f"alice {ALICE}\nbob {ALICE}\n", "line 2: this key is already tenant 'alice'"),
        (f"al/ice {ALICE}\n", "line 1: a tenant name"),
        ("alice k\n", f"line 1: a key is at least {MIN_KEY_CHARS} characters"),
        (f"alice {ALICE} admin\n", "line 1: the role is 'tenant' or 'operator'"),
        (f"alice {OPS}\n", "line 1: this key is also --api-key"),
        ("# nothing\n", "no 'TENANT KEY' lines"),
    ]:
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(KeysFileError, match=words):
            load_keys(bad, api_key=OPS)
    with pytest.raises(KeysFileError, match="missing"):
        load_keys(tmp_path / "missing")


def test_a_keys_file_every_user_can_read_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"alice {ALICE}\n")
    keys.chmod(0o600)
    load_keys(keys)
    assert "readable by every user" not in caplog.text
    keys.chmod(0o644)
    load_keys(keys)
    assert f"api_keys_file {keys} is readable by every user" in caplog.text and "644" in caplog.text


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
    keys.write_text(f"alice {ALICE}\nbob {BOB}\n")
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
    checked(r)  # the header says what usage does
    return {"usage": r.json()["usage"], "header": r.headers["x-omlx-cache"]}


def test_over_http_each_key_has_its_own_cache_and_stats(tenants) -> None:
    client, engine = tenants
    assert chat(client, ALICE)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    hit = chat(client, ALICE)
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] > 50
    other = chat(client, BOB)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert other["header"].startswith("cached=0; tier=none")
    assert chat(client, "sk-default")["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert [r.cache_tenant for r in engine.submitted] == ["alice", "alice", "bob", None]
    stats = client.get("/v1/cache/stats", headers={"x-api-key": ALICE}).json()
    assert stats["tenant"] == "alice"
    assert stats["models"][MODEL]["lookups"] == 2 and stats["models"][MODEL]["cached_tokens"] > 50
    bob = client.get("/v1/cache/stats", headers={"x-api-key": BOB}).json()
    assert bob["models"][MODEL]["cached_tokens"] == 0
    assert client.get("/v1/cache/stats", headers={"x-api-key": "sk-eve"}).status_code == 401


def test_a_tenant_sees_and_unpins_only_its_own_pins(tenants) -> None:
    client, _ = tenants
    chat(client, ALICE)
    alice = {"x-api-key": ALICE}
    pin = client.post(
        "/v1/cache/pins", headers=alice, json={"model": MODEL, "messages": PROMPT}
    ).json()
    assert pin["held_blocks"] == pin["blocks"] - 1 or pin["held_blocks"] == pin["blocks"]
    bob = {"x-api-key": BOB}
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
