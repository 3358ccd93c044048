"""The dashboard's parts without a browser: request log, series, state route, auth, actions."""

from __future__ import annotations

import base64
import re

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.api.dashboard import RequestSeries
from omlx.app.cache_controls.maintenance import CacheMaintenance
from omlx.app.cache_controls.report import CacheReport
from omlx.app.ops.request_log import RequestLog, current_api, current_report
from omlx.domain.generation import Finished
from tests.fakes import FakeColdSource
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container, reply
from tests.unit.test_cache_header import FIRST, TURN2, CachingEngine
from tests.unit.test_prefix_cache import make, seq, serve

HI = [{"role": "user", "content": "hi"}]
BEARER = {"Authorization": "Bearer k1"}


def basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"anyone:{password}".encode()).decode()}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished(prompt: int, cached: int, completion: int = 5, tier: str = "hot") -> Finished:
    return Finished("stop", prompt, completion, cached, tier=tier)


# ---- the request log and the series ------------------------------------------------


def test_the_log_keeps_the_newest_requests_with_their_rates_and_api():
    log = RequestLog(capacity=3)
    token = current_api.set(("anthropic", "/v1/messages"))
    try:
        for i in range(5):
            log.record("m", finished(100, 10 * i), ttft_s=0.2, decode_s=2.0)
    finally:
        current_api.reset(token)
    recent = log.recent()
    assert [r.seq for r in recent] == [5, 4, 3]
    assert recent[0].cached_tokens == 40 and recent[0].cached_share == 0.4
    assert recent[0].tokens_per_s == 2.0  # 4 tokens after the first, in 2 s
    assert (recent[0].api, recent[0].route) == ("anthropic", "/v1/messages")
    assert [r.seq for r in log.after(3)] == [4, 5]
    # Off HTTP (no middleware set it), and a one-token answer has no decode rate.
    lone = log.record("m", finished(10, 0, completion=1, tier="none"), ttft_s=None, decode_s=0.0)
    assert (lone.api, lone.route, lone.tokens_per_s, lone.ttft_s) == ("internal", "", None, None)


def test_a_sample_folds_each_model_s_new_requests_into_one_point():
    clock = Clock()
    log = RequestLog()
    series = RequestSeries(log, interval=5.0, max_points=2, clock=clock)
    log.record("a", finished(100, 0, tier="none"), 0.4, 1.0)
    log.record("a", finished(100, 80), 0.1, 1.0)
    log.record("a", finished(200, 120), 0.2, 1.0)
    log.record("b", finished(50, 0, tier="none"), 1.0, 1.0)
    taken = series.sample()
    assert set(taken) == {"a", "b"}
    a = taken["a"]
    assert (a.at, a.requests) == (1000.0, 3)
    assert a.hit_rate == pytest.approx(2 / 3)
    assert a.cached_share == pytest.approx(200 / 400)
    assert a.ttft_ms == pytest.approx(200.0)  # the median
    clock.now = 1005.0
    assert series.sample() == {}  # nothing new: no point, for no model
    for t in (1010.0, 1015.0):
        clock.now = t
        log.record("a", finished(10, 10), 0.05, 1.0)
        series.sample()
    points = series.points()
    assert [p.at for p in points["a"]] == [1010.0, 1015.0]  # bounded: the oldest went
    assert [p.at for p in points["b"]] == [1000.0]


def test_restoring_only_the_templates_preamble_is_no_hit_in_the_hit_rate():
    """Every chat request restores its template's fixed preamble (a default system prompt):
    counted, the hit rate would sit at 100%."""
    log = RequestLog()
    series = RequestSeries(log, interval=5.0)
    for cached, preamble in ((12, 12), (10, 12), (300, 12), (0, 0)):
        slot = {"report": CacheReport(400, cached, "hot", False, preamble=preamble)}
        token = current_report.set(slot)
        try:
            log.record("a", finished(400, cached), 0.1, 1.0)
        finally:
            current_report.reset(token)
    point = series.sample()["a"]
    assert point.hit_rate == pytest.approx(1 / 4)  # only the request that went past it
    assert point.cached_share == pytest.approx(322 / 1600)  # every restored token counts
    assert [r.preamble_tokens for r in log.recent()] == [0, 12, 12, 12]


# ---- the routes -------------------------------------------------------------------


def test_the_page_asks_a_browser_for_the_key_and_takes_it_as_basic_credentials():
    with TestClient(create_app(fake_container(api_key="k1"))) as c:
        refused = c.get("/dashboard")
        wrong = c.get("/dashboard", headers=basic("k2"))
        page = c.get("/dashboard", headers=basic("k1"))
        script = c.get("/dashboard/static/dashboard.js", headers=basic("k1"))
        state_refused = c.get("/v1/dashboard/state")
        state = c.get("/v1/dashboard/state", headers=basic("k1"))
        unknown_file = c.get("/dashboard/static/secrets.txt", headers=BEARER)
        garbled = c.get("/v1/dashboard/state", headers={"Authorization": "Basic %%%"})
        no_password = c.get(
            "/v1/dashboard/state",
            headers={"Authorization": "Basic " + base64.b64encode(b"k1").decode()},
        )
        action_refused = c.post(f"/v1/dashboard/models/{MODEL}/clear-cache", json={})
        # Basic credentials act only from the page itself: its token (or its origin).
        token = re.search(r'name="omlx-csrf" content="([0-9a-f]+)"', page.text).group(1)
        no_token = c.post(f"/v1/dashboard/models/{MODEL}/clear-cache", json={}, headers=basic("k1"))
        action = c.post(
            f"/v1/dashboard/models/{MODEL}/clear-cache",
            json={},
            headers={**basic("k1"), "x-omlx-csrf": token},
        )
        assert c.get("/health").status_code == 200
    assert refused.status_code == wrong.status_code == 401
    assert refused.headers["www-authenticate"].startswith('Basic realm="omlx"')
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/dashboard/static/dashboard.js"' in page.text
    assert script.status_code == 200 and "fetch(" in script.text
    assert (
        state_refused.status_code == 401 and state_refused.headers["www-authenticate"] == "Bearer"
    )
    assert state.status_code == 200
    assert unknown_file.status_code == 404
    assert garbled.status_code == no_password.status_code == action_refused.status_code == 401
    assert no_token.status_code == 403 and no_token.json()["error"]["code"] == "csrf_check_failed"
    assert action.status_code == 200


def test_the_state_lists_finished_requests_by_api_and_the_served_model():
    engine = FakeEngine(reply("a", "b", "c", cached=3))
    with TestClient(create_app(fake_container(engine))) as c:
        assert (
            c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI}).status_code == 200
        )
        assert (
            c.post(
                "/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 4}
            ).status_code
            == 200
        )
        state = c.get("/v1/dashboard/state").json()
        spec = c.get("/schema/openapi.json").json()
    (model,) = state["models"]
    assert (model["id"], model["state"], model["task"]) == (MODEL, "loaded", "chat")
    newest, older = state["requests"]
    assert (newest["api"], newest["route"]) == ("anthropic", "/v1/messages")
    assert (older["api"], older["route"]) == ("openai", "/v1/chat/completions")
    assert older["cached_tokens"] == 3 and older["completion_tokens"] == 3
    assert older["ttft_s"] is not None and older["ttft_s"] >= 0
    assert state["tiers"]["ssd"] == {"enabled": False}
    assert state["queue"] == {"active": 0, "queued": 0, "max_concurrent": 8, "max_queued": 4}
    assert older["divergence"] is None  # this fake model has no prefix cache: no report
    assert state["pins"] == {}  # nor pins
    # The state is documented; the page and the actions are not API operations.
    assert "/v1/dashboard/state" in spec["paths"]
    assert not [
        p for p in spec["paths"] if p.startswith("/dashboard") or "unload" in p or "vacuum" in p
    ]


def test_actions_take_json_only_and_refuse_by_name():
    container = fake_container(pin_models=())
    with TestClient(create_app(container)) as c:
        form = c.post(
            f"/v1/dashboard/models/{MODEL}/unload",
            content=b"{}",
            headers={"content-type": "text/plain"},
        )
        unknown = c.post("/v1/dashboard/models/nope/unload", json={})
        bad_size = c.post("/v1/dashboard/vacuum", json={"max_size": "lots"})
        no_ssd = c.post("/v1/dashboard/vacuum", json={"max_size": "1GB"})
        extra = c.post("/v1/dashboard/vacuum", json={"max_size": "1GB", "dry_run": True})
        # Just added, and no request has reached it yet: in use for a few seconds (pool.py).
        busy = c.post(f"/v1/dashboard/models/{MODEL}/unload", json={})
        assert (
            c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI}).status_code == 200
        )
        unloaded = c.post(f"/v1/dashboard/models/{MODEL}/unload", json={})
        again = c.post(f"/v1/dashboard/models/{MODEL}/unload", json={})
    assert form.status_code == 415 and form.json()["error"]["param"] == "content-type"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert bad_size.status_code == 400 and bad_size.json()["error"]["param"] == "max_size"
    assert no_ssd.status_code == 400 and no_ssd.json()["error"]["code"] == "no_ssd_tier"
    assert extra.status_code == 400  # a field that would change what it does is not ignored
    assert busy.status_code == 429 and busy.json()["error"]["code"] == "model_busy"
    assert unloaded.status_code == 200 and unloaded.json() == {"model": MODEL, "state": "available"}
    assert again.status_code == 400 and again.json()["error"]["code"] == "model_not_loaded"
    assert container.pool.loaded() == []


def test_clearing_a_model_empties_its_hot_tier_and_its_blocks_are_written_again():
    cold = FakeColdSource()
    prefix_cache = make(cold=cold)
    engine = FakeEngine()
    engine.prefix_cache = prefix_cache  # the model's services are built over it
    container = fake_container(engine)
    prompt = seq(40)
    serve(prefix_cache, prompt)
    assert serve(prefix_cache, prompt) > 0
    written = len(cold.puts)
    with TestClient(create_app(container)) as c:
        before = c.get("/v1/dashboard/state").json()["models"][0]["cache"]["hot"]["blocks"]
        cleared = c.post(f"/v1/dashboard/models/{MODEL}/clear-cache", json={}).json()
        after = c.get("/v1/dashboard/state").json()["models"][0]["cache"]["hot"]["blocks"]
    assert before > 0 and cleared["hot_blocks"] == before and after == 0
    cold.blocks.clear()  # what clearing the SSD tier's rows and files does to a real one
    assert serve(prefix_cache, prompt) == 0  # a real miss
    assert len(cold.puts) == 2 * written  # and its blocks go to disk again


def test_an_index_that_does_not_answer_leaves_the_rest_of_the_page():
    from omlx.domain.cache.ports import IndexUnavailable

    class AwayIndex:
        def usage(self):
            raise IndexUnavailable("the shared database is away")

    class Ssd:
        index = AwayIndex()
        dir, shared = "/nowhere", False

    container = fake_container()
    container.maintenance = CacheMaintenance(
        Ssd(), max_bytes=1 << 30, lease=60.0, is_pinned=lambda key: False, loaded=dict
    )
    with TestClient(create_app(container)) as c:
        r = c.get("/v1/dashboard/state")
    assert r.status_code == 200
    ssd = r.json()["tiers"]["ssd"]
    assert ssd["enabled"] and "the shared database is away" in ssd["unavailable"]
    assert r.json()["models"][0]["id"] == MODEL


# ---- the cache controls on the page: divergence points, pins, unpin ------------------


def test_a_request_that_missed_lists_where_it_diverged_from_its_cache_report():
    engine = CachingEngine()
    changed = [{"role": "system", "content": "You are a terse assistant."}, *TURN2[1:]]
    with TestClient(create_app(fake_container(engine))) as c:
        first = c.post("/v1/chat/completions", json={"model": MODEL, "messages": FIRST})
        turn2 = c.post("/v1/chat/completions", json={"model": MODEL, "messages": TURN2})
        again = c.post("/v1/chat/completions", json={"model": MODEL, "messages": TURN2})
        edited = c.post(
            "/v1/messages",
            json={
                "model": MODEL,
                "messages": changed[1:],
                "system": changed[0]["content"],
                "max_tokens": 4,
            },
        )
        requests = c.get("/v1/dashboard/state").json()["requests"]
        recent = c.get("/v1/cache/recent").json()["data"]
    assert all(r.status_code == 200 for r in (first, turn2, again, edited))
    by_seq = {r["seq"]: r for r in requests}
    # The first turn found nothing: it diverged at token 0, in the system message.
    assert by_seq[1]["divergence"]["at"] == 0
    assert (by_seq[1]["divergence"]["message"], by_seq[1]["divergence"]["role"]) == (0, "system")
    # The second turn found the first and went on past it, in a later message.
    d2 = by_seq[2]["divergence"]
    assert d2["at"] > 0 and d2["message"] >= 1 and d2["role"] in ("assistant", "user")
    assert d2["at"] == recent[2]["diverged_at"] and d2["message"] == recent[2]["message"]
    assert d2["prompt"] == recent[2]["excerpt"]["prompt"]
    # A repeat is a full hit: no divergence point.
    assert by_seq[3]["divergence"] is None
    # The edited system prompt diverges in message 0, where the cache held the old words.
    d4 = by_seq[4]["divergence"]
    assert (d4["message"], d4["role"]) == (0, "system") and d4["at"] == recent[0]["diverged_at"]
    assert "careful" in d4["cached"] and "terse" in d4["prompt"]
    assert by_seq[4]["api"] == "anthropic"


def test_the_state_lists_pins_with_their_ttl_and_the_page_unpins_them():
    engine = CachingEngine()
    with TestClient(create_app(fake_container(engine, api_key="k1"))) as c:
        assert (
            c.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": FIRST}, headers=BEARER
            ).status_code
            == 200
        )
        made = c.post(
            "/v1/cache/pins",
            json={"model": MODEL, "messages": FIRST, "ttl_seconds": 600},
            headers=BEARER,
        )
        assert made.status_code == 201, made.text
        pin = made.json()
        (shown,) = c.get("/v1/dashboard/state", headers=basic("k1")).json()["pins"][MODEL]
        refused = c.post(f"/v1/dashboard/pins/{pin['id']}/unpin", json={})
        form = c.post(
            f"/v1/dashboard/pins/{pin['id']}/unpin",
            content=b"{}",
            headers={**BEARER, "content-type": "text/plain"},
        )
        unpinned = c.post(  # as the page sends it: Basic credentials, from its own origin
            f"/v1/dashboard/pins/{pin['id']}/unpin",
            json={},
            headers={**basic("k1"), "origin": "http://testserver.local"},
        )
        gone = c.post(f"/v1/dashboard/pins/{pin['id']}/unpin", json={}, headers=BEARER)
        after = c.get("/v1/dashboard/state", headers=BEARER).json()["pins"][MODEL]
        listed = c.get("/v1/cache/pins", headers=BEARER).json()["data"]
    assert shown["id"] == pin["id"] and shown["tokens"] == pin["tokens"] > 0
    assert shown["blocks"] == pin["blocks"] and shown["held_blocks"] == pin["held_blocks"] > 0
    assert shown["source"] == "api" and shown["expires_at"] == pin["expires_at"]
    assert 590 < shown["ttl_left_s"] <= 600
    assert refused.status_code == 401
    assert form.status_code == 415 and form.json()["error"]["param"] == "content-type"
    assert unpinned.status_code == 200 and unpinned.json() == {
        "id": pin["id"],
        "model": MODEL,
        "deleted": True,
    }
    assert gone.status_code == 404
    assert after == [] and listed == []
    assert not engine.prefix_cache.pins.pins()
