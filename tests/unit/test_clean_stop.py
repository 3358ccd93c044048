"""The server's stop over fakes: the signal, the generation bridge, the pool's loads, the
streams' last events and the 503s (the real process: tests/e2e/test_clean_stop.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.errors import ServerStopping
from omlx.app.stop_signal import StopSignal
from omlx.domain.generation import PrefillStarted, TextDelta
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container
from tests.unit.test_api_streams import sse
from tests.unit.test_pool import pool_of
from tests.unit.test_service import LateEngine, request, service

HI = [{"role": "user", "content": "hi"}]
STOPPING = "the server is stopping; retry once it has restarted"


# ---- the signal ----------------------------------------------------------------------


def test_the_stop_tells_each_listener_once_and_late_ones_at_once():
    stop, heard = StopSignal(), []
    with stop.listening(lambda: heard.append("early")):
        assert stop.request() is True
        assert stop.request() is False
    with stop.listening(lambda: heard.append("late")):
        pass
    assert heard == ["early", "late"]
    assert stop.listening_count == 0
    with pytest.raises(ServerStopping):
        stop.check()


def test_work_is_cancelled_when_the_stop_comes_first_and_returned_otherwise():
    stop = StopSignal()
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def quick() -> int:
        return 7

    async def run() -> None:
        assert await stop.unless_stopping(quick()) == 7
        asyncio.get_running_loop().call_later(0.01, stop.request)
        with pytest.raises(ServerStopping):
            await stop.unless_stopping(forever())
        await asyncio.wait_for(cancelled.wait(), 1)

    asyncio.run(run())


# ---- a generation --------------------------------------------------------------------


def test_the_stop_ends_a_running_generation_at_once_and_cancels_it_on_the_engine():
    engine = LateEngine(10.0)  # its events would come in ten seconds
    svc = service(engine)

    async def run() -> list:
        seen = []
        events = svc.events(request(svc), keepalive=5.0)
        asyncio.get_running_loop().call_later(0.05, svc.stop.request)
        with pytest.raises(ServerStopping):
            async for event in events:
                seen.append(event)
        return seen

    started = time.monotonic()
    assert asyncio.run(run()) == []
    assert time.monotonic() - started < 1.0
    assert engine.cancelled == [1]  # the engine keeps what it prefilled, as for a client gone
    assert svc.observer.left == 1 and svc.in_flight == 0


def test_no_generation_starts_once_the_server_stops():
    engine = FakeEngine()
    svc = service(engine)
    svc.stop.request()
    with pytest.raises(ServerStopping):
        svc.stream(request(svc))
    assert engine.submitted == []


# ---- the pool's loads ------------------------------------------------------------------


def test_a_load_under_way_is_finished_and_closed_while_its_waiter_is_refused():
    stop = StopSignal()
    pool, loader, _ = pool_of({"small": 1}, stop=stop)
    loader.gate.clear()  # the load thread waits, as a large model's read does

    async def run() -> None:
        waiter = asyncio.create_task(pool.acquire("small"))
        await asyncio.sleep(0.05)
        assert pool.state("small") == "loading"
        stop.request()
        with pytest.raises(ServerStopping):
            await waiter
        threading.Timer(0.1, loader.gate.set).start()
        await pool.finish_loads()  # the load was not cut short: its thread ends first
        assert pool.state("small") == "loaded"

    asyncio.run(run())
    engine = pool.loaded()[0].engine
    pool.close()
    assert engine.stopped and loader.loads == ["small"]


def test_no_load_starts_once_the_server_stops():
    stop = StopSignal()
    pool, loader, _ = pool_of({"small": 1}, stop=stop)
    stop.request()
    with pytest.raises(ServerStopping):
        asyncio.run(pool.acquire("small"))
    assert loader.loads == []


# ---- the HTTP edge ------------------------------------------------------------------------


def stopping_app() -> tuple[TestClient, FakeEngine]:
    """An app whose engine streams a first piece, then the server stops mid-generation."""
    container = fake_container()

    def script(req):
        asyncio.get_running_loop().call_later(0.05, container.stop.request)
        return [PrefillStarted(0, len(req.prompt_tokens)), TextDelta("partial")]

    engine = container.pool.loaded()[0].engine
    engine.script = script
    return TestClient(create_app(container)), engine


def test_an_openai_stream_ends_with_the_stop_error_then_done():
    client, engine = stopping_app()
    with client as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI, "stream": True})
    data = [d for _, d in sse(r.text)]
    assert json.loads(data[1])["choices"][0]["delta"] == {"content": "partial"}
    assert json.loads(data[-2]) == {
        "error": {
            "message": STOPPING,
            "type": "server_error",
            "param": None,
            "code": "server_stopping",
        }
    }
    assert data[-1] == "[DONE]"
    assert engine.cancelled == [1]


def test_a_completions_stream_ends_the_same_way():
    client, _ = stopping_app()
    with client as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    data = [d for _, d in sse(r.text)]
    assert json.loads(data[-2])["error"]["code"] == "server_stopping"
    assert data[-1] == "[DONE]"


def test_an_anthropic_stream_ends_with_an_error_event():
    client, _ = stopping_app()
    with client as c:
        r = c.post(
            "/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 50, "stream": True}
        )
    events = sse(r.text)
    assert [n for n, _ in events][:3] == ["message_start", "ping", "content_block_start"]
    name, data = events[-1]
    assert name == "error"
    assert json.loads(data) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": STOPPING},
    }


def test_a_responses_stream_ends_with_an_error_event_then_response_failed():
    client, _ = stopping_app()
    with client as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": "hi", "stream": True})
    events = [json.loads(d) for _, d in sse(r.text)]
    error, failed = events[-2], events[-1]
    assert error["type"] == "error" and error["code"] == "server_stopping"
    assert error["message"] == STOPPING
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": STOPPING}


def test_an_answer_cut_by_the_stop_is_a_503():
    client, _ = stopping_app()
    with client as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "server_stopping"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": HI}),
        ("/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 5}),
        ("/v1/models", None),
        ("/health", None),
    ],
)
def test_requests_that_reach_a_stopping_server_get_a_503_in_their_envelope(path, body):
    container = fake_container()
    with TestClient(create_app(container)) as c:
        container.stop.request()
        r = c.request("POST" if body else "GET", path, json=body)
    assert r.status_code == 503, r.text
    assert r.headers["connection"] == "close"
    if path.startswith("/v1/messages"):
        assert r.json() == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": STOPPING},
        }
    else:
        assert r.json() == {
            "error": {
                "message": STOPPING,
                "type": "server_error",
                "param": None,
                "code": "server_stopping",
            }
        }
    assert container.pool.loaded()[0].engine.submitted == []
