"""Roles over HTTP (litestar's test client, the real app, a fake engine with a real prefix
cache): what a tenant's key may see and do with another tenant's data (nothing), and what
an operator's key may do (the whole server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from tests.tenant_keys import ALICE, BOB, OPS, ROOT, keys_file
from tests.unit.api_fakes import MODEL, fake_container
from tests.unit.test_cache_header import CachingEngine

SECRET = "My password is hunter2 and the vault opens at dawn. " * 6
PROMPT = [
    {"role": "system", "content": SECRET},
    {"role": "user", "content": "Summarise the migration plan."},
]


def key(k: str) -> dict[str, str]:
    return {"authorization": f"Bearer {k}"}


@pytest.fixture
def server(tmp_path: Path) -> TestClient:
    keys = keys_file(tmp_path)
    container = fake_container(CachingEngine(), api_keys_file=str(keys), api_key=ROOT)
    with TestClient(create_app(container)) as client:
        yield client


def chat(client: TestClient, k: str, **extra: object) -> dict:
    body = {"model": MODEL, "messages": PROMPT, **extra}
    r = client.post("/v1/chat/completions", headers=key(k), json=body)
    assert r.status_code == 200, r.text
    return r.json()


OPERATOR_ROUTES = [
    ("POST", f"/v1/dashboard/models/{MODEL}/unload", {}),
    ("POST", f"/v1/dashboard/models/{MODEL}/clear-cache", {}),
    ("POST", "/v1/dashboard/vacuum", {"max_size": "0"}),
    ("GET", "/metrics", None),
]


@pytest.mark.parametrize(("method", "path", "body"), OPERATOR_ROUTES)
def test_a_tenant_key_cannot_act_on_the_whole_server(server, method, path, body) -> None:
    r = server.request(method, path, headers=key(BOB), json=body)
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "operator_only"


def test_operator_keys_act_on_the_whole_server(server) -> None:
    chat(server, ALICE)
    assert server.get("/metrics", headers=key(OPS)).status_code == 200
    assert server.get("/metrics", headers=key(ROOT)).status_code == 200
    cleared = server.post(f"/v1/dashboard/models/{MODEL}/clear-cache", headers=key(OPS), json={})
    assert cleared.status_code == 200, cleared.text
    assert cleared.json()["hot_blocks"] > 0
    stats = server.get("/v1/cache/stats", headers=key(OPS)).json()
    assert stats["tenant"] == "ops" and stats["tenants"]["alice"][MODEL]["lookups"] == 1
    assert "tenants" not in server.get("/v1/cache/stats", headers=key(BOB)).json()


def test_health_tells_readiness_without_a_key_and_the_counters_to_operators(server) -> None:
    assert server.get("/health").json() == {"status": "ok", "server": "omlx", "ready": True}
    assert server.get("/health", headers=key("sk-wrong-0123456789")).json().keys() == {
        "status",
        "server",
        "ready",
    }
    tenant = server.get("/health", headers=key(BOB)).json()  # the models, not the traffic
    assert tenant["models"][MODEL] == {"state": "loaded", "task": "chat"} and "cache" not in tenant
    whole = server.get("/health", headers=key(OPS)).json()
    assert "restored" in whole["cache"] and whole["models"]


def test_a_tenant_s_dashboard_shows_its_own_requests_pins_and_usage(server) -> None:
    chat(server, ALICE)
    chat(server, BOB)
    pin = server.post(
        "/v1/cache/pins", headers=key(ALICE), json={"model": MODEL, "messages": PROMPT}
    )
    assert pin.status_code == 201, pin.text
    bob = server.get("/v1/dashboard/state", headers=key(BOB)).json()
    assert bob["server"]["role"] == "tenant" and bob["server"]["tenant"] == "bob"
    assert [r["tenant"] for r in bob["requests"]] == ["bob"]
    assert bob["tiers"] is None and bob["pins"] == {MODEL: []}
    assert bob["models"][0]["cache"]["lookups"] == 1  # its own, not both tenants'
    assert "hot" not in bob["models"][0]["cache"]
    assert set(bob["series"]) <= {MODEL}
    ops = server.get("/v1/dashboard/state", headers=key(OPS)).json()
    assert ops["server"]["role"] == "operator"
    assert sorted(r["tenant"] for r in ops["requests"]) == ["alice", "bob"]
    assert ops["tiers"]["hot"]["blocks"] > 0 and ops["models"][0]["cache"]["lookups"] == 2


def test_the_operator_sees_no_excerpt_of_another_tenant_s_prompt(server) -> None:
    chat(server, ALICE)
    edited = [{"role": "system", "content": SECRET.replace("dawn", "dusk")}, PROMPT[1]]
    r = server.post(
        "/v1/chat/completions", headers=key(ALICE), json={"model": MODEL, "messages": edited}
    )
    assert r.status_code == 200
    ops = server.get("/v1/dashboard/state", headers=key(OPS)).json()
    missed = [r for r in ops["requests"] if r["divergence"] and r["cached_tokens"]]
    assert missed and all(r["divergence"]["prompt"] == "" for r in missed)
    alice = server.get("/v1/dashboard/state", headers=key(ALICE)).json()
    assert any("usk" in (r["divergence"] or {}).get("prompt", "") for r in alice["requests"])
    assert server.get("/v1/cache/recent", headers=key(BOB)).json()["data"] == []


def test_a_tenant_cannot_read_continue_list_or_delete_another_s_response(server) -> None:
    body = {"model": MODEL, "input": "Keep this between us: the launch is on Friday."}
    made = server.post("/v1/responses", headers=key(ALICE), json=body)
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    for method, path in [
        ("GET", f"/v1/responses/{rid}"),
        ("GET", f"/v1/responses/{rid}/input_items"),
        ("DELETE", f"/v1/responses/{rid}"),
    ]:
        assert server.request(method, path, headers=key(BOB)).status_code == 404, path
    follow = {"model": MODEL, "input": "What did I say?", "previous_response_id": rid}
    refused = server.post("/v1/responses", headers=key(BOB), json=follow)
    assert refused.status_code == 400 and "previous_response_id" in refused.text
    explained = server.post(
        "/v1/cache/explain",
        headers=key(BOB),
        json={"model": MODEL, "input": "x", "previous_response_id": rid},
    )
    assert explained.status_code == 400
    assert server.get(f"/v1/responses/{rid}", headers=key(ALICE)).status_code == 200
    assert server.post("/v1/responses", headers=key(ALICE), json=follow).status_code == 200
    assert server.delete(f"/v1/responses/{rid}", headers=key(ALICE)).status_code == 200


def test_a_long_prompt_cache_key_is_refused_by_name(server) -> None:
    r = server.post(
        "/v1/chat/completions",
        headers=key(ALICE),
        json={"model": MODEL, "messages": PROMPT, "prompt_cache_key": "k" * 1_000_000},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_cache_key"
    chat(server, ALICE, prompt_cache_key="k" * 512)


def test_reports_keep_excerpts_out_when_asked(tmp_path: Path) -> None:
    container = fake_container(CachingEngine(), report_excerpts=False)
    with TestClient(create_app(container)) as client:
        client.post("/v1/chat/completions", json={"model": MODEL, "messages": PROMPT})
        edited = [{"role": "system", "content": SECRET.replace("dawn", "dusk")}, PROMPT[1]]
        r = client.post("/v1/cache/explain", json={"model": MODEL, "messages": edited})
        assert r.status_code == 200, r.text
        report = r.json()
        assert 0 < report["cached_tokens"] < report["prompt_tokens"]
        assert report["excerpt"] == {"before": "", "prompt": "", "cached": ""}
