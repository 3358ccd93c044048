"""API key, client disconnects and /metrics against real server processes."""

from __future__ import annotations

import time

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import API_KEY
from tests.scripted_model import MODEL_ID

KEY = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGE = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
LOOP = {"model": MODEL_ID, "prompt": "<|loop|>", "max_tokens": 30000}  # decodes until stopped


@pytest.mark.parametrize(
    ("method", "path", "body", "envelope"),
    [
        ("GET", "/v1/models", None, "openai"),
        ("POST", "/v1/chat/completions", CHAT, "openai"),
        ("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "x"}, "openai"),
        ("POST", "/v1/responses", {"model": MODEL_ID, "input": "x"}, "openai"),
        ("GET", "/v1/responses/resp_1/input_items", None, "openai"),
        ("GET", "/metrics", None, "openai"),
        ("GET", "/schema/openapi.json", None, "openai"),
        ("POST", "/v1/messages", MESSAGE, "anthropic"),
        ("POST", "/v1/messages/count_tokens", MESSAGE, "anthropic"),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"Authorization": API_KEY}],
    ids=["none", "wrong-bearer", "wrong-x-api-key", "no-scheme"],
)
def test_every_route_needs_the_key(scripted_server, method, path, body, envelope, headers):
    r = httpx.request(
        method, scripted_server.base_url + path, json=body, headers=headers, timeout=30
    )
    assert r.status_code == 401, r.text
    if envelope == "openai":
        assert r.json()["error"]["type"] == "authentication_error"
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    else:
        assert r.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": r.json()["error"]["message"]},
        }


def test_health_is_open_and_both_headers_work(scripted_server):
    base = scripted_server.base_url
    assert httpx.get(base + "/health", timeout=5).status_code == 200
    assert httpx.get(base + "/v1/models", headers=KEY, timeout=5).status_code == 200
    assert (
        httpx.get(base + "/v1/models", headers={"x-api-key": API_KEY}, timeout=5).status_code == 200
    )


def test_sdks_raise_authentication_errors(scripted_server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=scripted_server.base_url + "/v1", api_key="wrong", max_retries=0
        ).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(
            base_url=scripted_server.base_url, api_key="wrong", max_retries=0
        ).messages.create(**MESSAGE)


def test_no_key_needed_when_none_is_set(tiny_server):
    assert httpx.get(tiny_server.base_url + "/v1/models", timeout=5).status_code == 200


def _engine(server) -> dict:
    return httpx.get(server.base_url + "/health", headers=KEY, timeout=5).json()["engine"]


def _wait_idle(server, seconds: float = 5.0) -> float:
    start = time.monotonic()
    while _engine(server)["active"] or _engine(server)["queued"]:
        assert time.monotonic() - start < seconds, (
            f"still generating {seconds}s after the client left"
        )
        time.sleep(0.02)
    return time.monotonic() - start


def _cancelled(server) -> float:
    return _samples(server, headers=KEY).get(
        ("omlx_generations_total", (("reason", "cancelled"),)), 0.0
    )


def test_closing_a_stream_stops_its_generation(scripted_server):
    before = _cancelled(scripted_server)
    with httpx.stream(
        "POST",
        scripted_server.base_url + "/v1/completions",
        json={**LOOP, "stream": True},
        headers=KEY,
        timeout=30,
    ) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        assert _engine(scripted_server)["active"] == 1
    assert _wait_idle(scripted_server) < 2.0
    assert _cancelled(scripted_server) == before + 1


def test_a_client_that_gives_up_stops_a_plain_request(scripted_server):
    before = _cancelled(scripted_server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            scripted_server.base_url + "/v1/completions", json=LOOP, headers=KEY, timeout=0.5
        )
    assert _wait_idle(scripted_server) < 2.0
    assert _cancelled(scripted_server) == before + 1


def _samples(server, headers: dict | None = None) -> dict[tuple, float]:
    r = httpx.get(server.base_url + "/metrics", headers=headers or {}, timeout=5)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_parse_and_move(tiny_server):
    route = (
        "omlx_http_requests_total",
        (("method", "POST"), ("route", "/v1/chat/completions"), ("status", "200")),
    )
    before = _samples(tiny_server)
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "count me " * 10}],
        "max_tokens": 3,
    }
    for _ in range(2):
        assert (
            httpx.post(
                tiny_server.base_url + "/v1/chat/completions", json=body, timeout=60
            ).status_code
            == 200
        )
    httpx.get(tiny_server.base_url + "/no/such/route", timeout=5)
    after = _samples(tiny_server)
    assert after[route] == before.get(route, 0) + 2
    assert (
        after[
            (
                "omlx_http_requests_total",
                (("method", "GET"), ("route", "unmatched"), ("status", "404")),
            )
        ]
        >= 1
    )
    for counter in (
        "omlx_prompt_tokens_total",
        "omlx_generated_tokens_total",
        "omlx_time_to_first_token_seconds_count",
    ):
        assert after[(counter, ())] > before.get((counter, ()), 0), counter
    # the second identical prompt was served from the hot tier
    assert after[("omlx_cached_prompt_tokens_total", ())] > before.get(
        ("omlx_cached_prompt_tokens_total", ()), 0
    )
    model = next(
        dict(labels)["model"] for name, labels in after if name == "omlx_engine_active_requests"
    )
    assert after[("omlx_cache_block_hits_total", (("model", model), ("tier", "hot")))] > 0
    assert (
        "omlx_http_request_duration_seconds_count",
        (("route", "/v1/chat/completions"),),
    ) in after
    # from the SSD writer, which every model shares
    assert ("omlx_cache_blocks_written_total", (("model", "all"), ("tier", "ssd"))) in after
    for gauge in ("omlx_engine_active_requests", "omlx_engine_queued_requests", "omlx_cache_bytes"):
        assert any(name == gauge for name, _ in after), gauge
