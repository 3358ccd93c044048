"""Hostile request bodies (issue 22 rows 4 and 10): deep nesting, lax types, a 400 each."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.api.body import MAX_NESTING, nesting_depth
from tests.unit.api_fakes import MODEL, fake_container

HI = [{"role": "user", "content": "hi"}]


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v1/chat/completions", '{"model": "%s", "messages": [], "metadata": {"x": %s}}'),
        ("/v1/messages", '{"model": "%s", "max_tokens": 1, "messages": [], "metadata": %s}'),
        ("/v1/responses", '{"model": "%s", "input": %s}'),
        ("/v1/embeddings", '{"model": "%s", "input": %s}'),
    ],
)
@pytest.mark.parametrize("levels", [MAX_NESTING + 1, 1000, 100_000])
def test_a_body_nested_too_deeply_is_a_400_in_the_route_envelope(path, template, levels):
    body = template % (MODEL, nested(levels))
    with TestClient(create_app(fake_container())) as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "nested too deeply" in error["message"]
    if path.startswith("/v1/messages"):
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["type"] == "invalid_request_error"


def test_a_schema_nested_500_objects_deep_is_refused_not_a_500():
    schema = '{"type": "string"}'
    for _ in range(500):
        schema = f'{{"type": "object", "properties": {{"a": {schema}}}}}'
    fmt = f'{{"type": "json_schema", "json_schema": {{"name": "deep", "schema": {schema}}}}}'
    body = '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "response_format": %s}'
    with TestClient(create_app(fake_container())) as c:
        r = c.post(
            "/v1/chat/completions",
            content=body % (MODEL, fmt),
            headers={"content-type": "application/json"},
        )
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]


def test_nesting_at_the_limit_is_served():
    value: list = []
    for _ in range(MAX_NESTING - 3):
        value = [value]
    with TestClient(create_app(fake_container())) as c:
        r = c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": HI, "metadata": {"x": value}}
        )
    assert r.status_code == 200, r.text


def test_nesting_depth_counts_iteratively_and_stops_past_the_limit():
    assert nesting_depth({"a": [1, {"b": []}]}, 10) == 4
    assert nesting_depth([[[]]], 10) == 3
    assert nesting_depth("x", 10) == 0
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert nesting_depth(deep, 10) == 11


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": "5"}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": HI, "temperature": "0.5"},
            "temperature",
        ),
        ("/v1/chat/completions", {"model": MODEL, "messages": HI, "stream": "true"}, "stream"),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2.5}, "max_tokens"),
        ("/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": "5"}, "max_tokens"),
        (
            "/v1/responses",
            {"model": MODEL, "input": "hi", "max_output_tokens": "5"},
            "max_output_tokens",
        ),
        ("/v1/embeddings", {"model": MODEL, "input": "hi", "dimensions": "8"}, "dimensions"),
        ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["d"], "top_n": "1"}, "top_n"),
    ],
)
def test_a_string_where_a_number_belongs_is_a_400_naming_the_field(path, body, param):
    with TestClient(create_app(fake_container())) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert param in error["message"]
    if not path.startswith("/v1/messages"):
        assert error["param"] == param


def test_strict_types_still_accept_extras_and_ints_for_floats():
    body = {
        "model": MODEL,
        "messages": HI,
        "max_tokens": 3,
        "temperature": 1,
        "unknown_extra": {"a": 1},
    }
    with TestClient(create_app(fake_container())) as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def test_a_body_that_is_not_json_is_a_400():
    with TestClient(create_app(fake_container())) as c:
        r = c.post(
            "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
        )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
