"""The app around the routes: API key, body limit, /metrics, /schema."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from omlx.app.api.app import create_app
from omlx.app.settings import load_settings
from omlx.domain.cache.blocks import NamespaceInfo
from omlx.domain.cache.cold_tier import ColdTierStats
from omlx.domain.cache.cold_writes import WriterStats
from omlx.domain.cache.hot_tier import HotTierStats
from omlx.domain.cache.tally import PrefixCacheStats
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container, reply

HI = [{"role": "user", "content": "hi"}]
ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HI}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x"}),
    ("POST", "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 2}),
    ("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": HI}),
    ("POST", "/v1/responses", {"model": MODEL, "input": "hi"}),
    ("GET", "/metrics", None),
    ("GET", "/schema/openapi.json", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_with_a_key_every_route_but_health_needs_it(method, path, body):
    with TestClient(create_app(fake_container(api_key="k1"))) as c:
        refused = c.request(method, path, json=body)
        wrong = c.request(method, path, json=body, headers={"Authorization": "Bearer k2"})
        bearer = c.request(method, path, json=body, headers={"Authorization": "Bearer k1"})
        header = c.request(method, path, json=body, headers={"x-api-key": "k1"})
        assert c.get("/health").status_code == 200
    assert refused.status_code == wrong.status_code == 401
    assert refused.headers["www-authenticate"] == "Bearer"
    if path.startswith("/v1/messages"):
        assert refused.json() == {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": refused.json()["error"]["message"],
            },
        }
    else:
        assert refused.json()["error"] | {"message": ""} == {
            "message": "",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    assert bearer.status_code == header.status_code == 200


def test_without_a_key_nothing_is_asked():
    with TestClient(create_app(fake_container())) as c:
        assert c.get("/v1/models").status_code == 200


def test_models_name_a_loaded_model_s_context_and_health_names_the_server():
    """What ``omlx launch`` reads: that the port is omlx's, and how long a prompt may be."""
    with TestClient(create_app(fake_container())) as c:
        (card,) = [m for m in c.get("/v1/models").json()["data"] if m["id"] == MODEL]
        assert c.get("/health").json()["server"] == "omlx"
    assert card["state"] == "loaded" and card["context_length"] == 4096


def test_the_key_comes_from_the_environment():
    assert load_settings(env={"OMLX_API_KEY": "from-env"}).api_key == "from-env"
    assert (
        load_settings(env={"OMLX_API_KEY": "from-env"}, flags={"api_key": "flag"}).api_key == "flag"
    )


def test_a_body_over_the_limit_is_413_in_each_envelope():
    with TestClient(create_app(fake_container(max_request_body_bytes=200))) as c:
        big = "x" * 500
        openai = c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": big}]},
        )
        anthropic = c.post(
            "/v1/messages",
            json={"model": MODEL, "messages": [{"role": "user", "content": big}], "max_tokens": 1},
        )
    assert openai.status_code == anthropic.status_code == 413
    assert (
        openai.json()["error"]["type"] == "invalid_request_error"
        and "200 bytes" in openai.json()["error"]["message"]
    )
    assert anthropic.json()["error"]["type"] == "request_too_large"


def samples(c: TestClient) -> dict[tuple, float]:
    text = c.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_metrics_count_requests_tokens_and_first_tokens():
    engine = FakeEngine(reply("a", "b", "c", cached=2))
    with TestClient(create_app(fake_container(engine))) as c:
        before = samples(c)
        c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})
        c.post("/v1/messages", json={"model": "nope", "messages": HI, "max_tokens": 1})
        c.get("/nowhere")
        after = samples(c)
    assert ("omlx_generated_tokens_total", ()) in before
    assert (
        after[
            (
                "omlx_http_requests_total",
                (("method", "POST"), ("route", "/v1/chat/completions"), ("status", "200")),
            )
        ]
        == 1
    )
    assert (
        after[
            (
                "omlx_http_requests_total",
                (("method", "POST"), ("route", "/v1/messages"), ("status", "404")),
            )
        ]
        == 1
    )
    assert (
        after[
            (
                "omlx_http_requests_total",
                (("method", "GET"), ("route", "unmatched"), ("status", "404")),
            )
        ]
        == 1
    )
    assert after[("omlx_generated_tokens_total", ())] == 3
    assert after[("omlx_cached_prompt_tokens_total", ())] == 2
    assert after[("omlx_time_to_first_token_seconds_count", ())] == 1
    assert after[("omlx_generations_total", (("reason", "stop"),))] == 1
    assert after[("omlx_engine_queued_requests", (("model", MODEL),))] == 0
    assert after[("omlx_models_loaded", ())] == 1


def test_metrics_read_cache_tiers_at_scrape_time():
    hot = HotTierStats(blocks=3, bytes=300, max_bytes=1000, hits=5, misses=1, evictions=2, pinned=0)

    class Prefix:
        namespace = NamespaceInfo("ab" * 32, MODEL, "/m", 16, "float16", 2)
        block_size = 16

        def stats(self):
            return PrefixCacheStats(7, 700, 320, 5, 1, 4, 4, 0, None, hot=hot)

    class Writer:
        def stats(self):
            return WriterStats(
                written=4,
                written_bytes=400,
                evicted_blocks=1,
                evicted_bytes=100,
                dropped_no_space=2,
                queued=1,
            )

    class Cold:
        def stats(self):
            return ColdTierStats(hits=1, corrupt_blocks=1)

        writer = Writer()

    container = fake_container()
    (served,) = container.pool.loaded()
    served.prefix_cache, served.cold_tier = Prefix(), Cold()
    container.writer = Cold.writer
    with TestClient(create_app(container)) as c:
        got = samples(c)
    # each model's tiers under its name; the writer every model shares as "all"
    m, shared = ("model", MODEL), ("model", "all")
    assert got[("omlx_cache_block_hits_total", (m, ("tier", "hot")))] == 5
    assert got[("omlx_cache_block_hits_total", (m, ("tier", "ssd")))] == 1
    assert got[("omlx_cache_blocks_written_total", (shared, ("tier", "ssd")))] == 4
    assert got[("omlx_cache_bytes_written_total", (shared, ("tier", "ssd")))] == 400
    assert got[("omlx_cache_blocks_evicted_total", (m, ("tier", "hot")))] == 2
    assert (
        got[("omlx_cache_blocks_dropped_total", (shared, ("reason", "no_space"), ("tier", "ssd")))]
        == 2
    )
    assert (
        got[("omlx_cache_blocks_rejected_total", (m, ("reason", "corrupt"), ("tier", "ssd")))] == 1
    )
    assert got[("omlx_cache_bytes", (m, ("tier", "hot")))] == 300
    assert got[("omlx_cache_write_queue_blocks", (shared,))] == 1


def test_openapi_documents_each_route_and_its_bodies():
    with TestClient(create_app(fake_container())) as c:
        spec = c.get("/schema/openapi.json").json()
    ops = {(m, p): op for p, item in spec["paths"].items() for m, op in item.items()}
    assert {op["operationId"] for op in ops.values()} == {
        "health",
        "listModels",
        "createChatCompletion",
        "createCompletion",
        "createMessage",
        "countMessageTokens",
        "createResponse",
        "getResponse",
        "deleteResponse",
        "listResponseInputItems",
        "createEmbedding",
        "rerank",
        "metrics",
        "dashboardState",
        "explainCache",
        "createCachePin",
        "listCachePins",
        "deleteCachePin",
        "deleteCachePinById",
        "cacheTenantStats",
        "exportCache",
        "importCache",
        "recentCacheReports",
    }
    responses = ops[("post", "/v1/responses")]
    assert set(responses["responses"]["200"]["content"]) == {
        "application/json",
        "text/event-stream",
    }
    assert responses["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/OpenAIErrorResponse"
    )
    chat = ops[("post", "/v1/chat/completions")]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ChatCompletionRequest"
    )
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/OpenAIErrorResponse"
    )
    message = ops[("post", "/v1/messages")]
    assert message["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Message"
    )
    assert message["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/AnthropicErrorResponse"
    )
