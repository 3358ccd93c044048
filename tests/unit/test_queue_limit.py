"""A full engine queue is a 429 before the response starts, on every create route, streamed or
not; the memory guard's capacity, a port member of the engine, limits max_tokens up front."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container

HI = [{"role": "user", "content": "hi"}]
CREATE = [
    ("/v1/chat/completions", {"model": MODEL, "messages": HI}),
    ("/v1/completions", {"model": MODEL, "prompt": "x"}),
    ("/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 2}),
    ("/v1/responses", {"model": MODEL, "input": "hi"}),
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize(("path", "body"), CREATE, ids=[p for p, _ in CREATE])
def test_a_full_queue_is_a_429_and_nothing_reaches_the_engine(path, body, stream):
    engine = FakeEngine()
    engine.queued = 4  # fake_container's max_queued_requests
    with TestClient(create_app(fake_container(engine))) as c:
        refused = c.post(path, json={**body, "stream": stream})
        engine.queued = 3
        served = c.post(path, json={**body, "stream": stream})
    assert refused.status_code == 429, refused.text
    assert "text/event-stream" not in refused.headers.get("content-type", "")
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and "4 requests are waiting" in error["message"]
    assert served.status_code == 200 and len(engine.submitted) == 1


def test_the_engine_s_kv_capacity_bounds_max_tokens_before_submitting():
    engine = FakeEngine()
    with TestClient(create_app(fake_container(engine))) as c:
        chat = {"model": MODEL, "messages": HI}
        assert c.post("/v1/chat/completions", json=chat).status_code == 200
        prompt = len(engine.submitted[0].prompt_tokens)
        engine.kv_token_capacity = prompt + 10
        refused = c.post("/v1/chat/completions", json={**chat, "max_tokens": 11})
        lowered = c.post("/v1/chat/completions", json=chat)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "kv_memory_exceeded"
    assert refused.json()["error"]["param"] == "max_tokens"
    assert lowered.status_code == 200
    assert [r.max_tokens for r in engine.submitted] == [16, 10]  # the default 16, lowered to fit
