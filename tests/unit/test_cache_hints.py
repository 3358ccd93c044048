"""The clients' cache hints over HTTP: Anthropic breakpoints and OpenAI retention become pins."""

from __future__ import annotations

from typing import Any

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from tests.unit.api_fakes import MODEL, fake_container
from tests.unit.test_cache_header import CachingEngine

SYSTEM = [{"type": "text", "text": "You are a careful assistant who answers briefly."}]


def marked(ttl: str | None = None) -> dict[str, Any]:
    return {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}


@pytest.fixture
def app() -> tuple[TestClient, CachingEngine]:
    engine = CachingEngine()
    with TestClient(create_app(fake_container(engine))) as client:
        yield client, engine


def message(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/messages", json={"model": MODEL, "max_tokens": 8, **body})


def test_breakpoints_pin_their_prefix_for_their_ttl_and_count_as_writes(app) -> None:
    client, engine = app
    system = [{**SYSTEM[0], "cache_control": marked("1h")}]
    turns = [
        {"role": "user", "content": "Read the file."},
        {"role": "assistant", "content": "Done."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Now sum it.", "cache_control": marked()}],
        },
    ]
    r = message(client, system=system, messages=turns)
    assert r.status_code == 200, r.text
    pins = {p["source"]: p for p in client.get("/v1/cache/pins").json()["data"]}
    assert set(pins) == {"cache_control"}
    listed = sorted(client.get("/v1/cache/pins").json()["data"], key=lambda p: p["tokens"])
    system_pin, last_pin = listed
    rendered_system = len("<system>" + SYSTEM[0]["text"] + "\n")
    assert rendered_system <= system_pin["tokens"] <= rendered_system + len("<user>")
    assert system_pin["expires_at"] - system_pin["created_at"] == pytest.approx(3600)
    assert last_pin["expires_at"] - last_pin["created_at"] == pytest.approx(300)
    usage = r.json()["usage"]
    prompt = len(engine.submitted[0].prompt_tokens)
    assert usage["cache_creation_input_tokens"] == last_pin["tokens"] > 0
    assert usage["input_tokens"] + usage["cache_creation_input_tokens"] == prompt
    # The same breakpoints again extend those pins; they are not added twice.
    r = message(client, system=system, messages=turns)
    assert len(client.get("/v1/cache/pins").json()["data"]) == 2
    # All of it was read but the one token always computed (and written again).
    assert r.json()["usage"]["cache_creation_input_tokens"] <= 1


def test_a_pinned_breakpoint_outlives_traffic_that_evicts_the_rest() -> None:
    engine = CachingEngine(hot_bytes=8 * 8 * 40, cold=False)  # FakeCodec: 8 B a token; 40 blocks
    with TestClient(create_app(fake_container(engine))) as client:
        check_pinned_breakpoint_outlives_traffic(client)


def check_pinned_breakpoint_outlives_traffic(client: TestClient) -> None:
    plain = [{"type": "text", "text": "An unpinned system prompt of about the same length."}]
    marked_system = [{**SYSTEM[0], "cache_control": marked()}]
    ask = [{"role": "user", "content": "first question"}]
    message(client, system=marked_system, messages=ask)
    message(client, system=plain, messages=ask)
    for k in range(30):  # other conversations, far more than RAM holds
        message(client, messages=[{"role": "user", "content": f"unrelated {k} " * 8}])

    def cached(system: list[dict[str, Any]]) -> int:
        body = {
            "model": MODEL,
            "system": system,
            "messages": [{"role": "user", "content": "again"}],
        }
        return client.post("/v1/cache/explain", json=body).json()["cached_tokens"]

    whole_blocks = len("<system>" + SYSTEM[0]["text"]) // 8 * 8  # the pin's full blocks
    assert cached(SYSTEM) >= whole_blocks
    assert cached(plain) <= len("<system>")  # the rest of it was pushed out by the traffic


def test_malformed_hints_are_a_400_naming_them(app) -> None:
    client, engine = app
    bad_ttl = [{**SYSTEM[0], "cache_control": marked("2h")}]
    r = message(client, system=bad_ttl, messages=[{"role": "user", "content": "hi"}])
    assert r.status_code == 400 and "system[0].cache_control.ttl" in r.json()["error"]["message"]
    r = message(
        client, cache_control={"type": "forever"}, messages=[{"role": "user", "content": "hi"}]
    )
    assert r.status_code == 400 and "cache_control" in r.json()["error"]["message"]
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "prompt_cache_retention": "7d",
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_cache_retention"
    assert engine.submitted == []


def test_retention_pins_for_a_day_and_a_cache_key_names_the_previous_turn(app) -> None:
    client, engine = app
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "One?"}]
    body = {"model": MODEL, "prompt_cache_key": "session-7", "prompt_cache_retention": "24h"}
    assert client.post("/v1/chat/completions", json={**body, "messages": first}).status_code == 200
    (pin,) = client.get("/v1/cache/pins").json()["data"]
    assert (pin["source"], pin["group"]) == ("prompt_cache_retention", "session-7")
    assert pin["expires_at"] - pin["created_at"] == pytest.approx(86400)
    assert pin["tokens"] == len(engine.submitted[0].prompt_tokens)
    # no-store requests pin nothing
    other = [{"role": "user", "content": "Unrelated."}]
    client.post(
        "/v1/chat/completions", json={**body, "messages": other, "omlx_cache_control": "no-store"}
    )
    assert len(client.get("/v1/cache/pins").json()["data"]) == 1


def test_a_no_store_request_pins_none_of_its_breakpoints(app) -> None:
    client, _ = app
    system = [{**SYSTEM[0], "cache_control": marked()}]
    r = client.post(
        "/v1/messages",
        headers={"x-omlx-cache-control": "no-store"},
        json={
            "model": MODEL,
            "max_tokens": 8,
            "system": system,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert r.status_code == 200 and r.json()["usage"]["cache_creation_input_tokens"] == 0
    assert client.get("/v1/cache/pins").json()["data"] == []
