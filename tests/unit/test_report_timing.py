"""When a request's cache report is made and sent: from the engine's restore, before the
response starts, so ``x-omlx-cache`` says what usage does even when the cache changed while
the request waited (another request's prefill kept its prefix meanwhile); a stream queued
past the hold starts with the report pending, and the report still reaches the log."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import anyio
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.cache_controls.report import CacheReport
from omlx.app.cache_controls.reporting import reported
from omlx.domain.cache.blocks import CachedPrefix
from omlx.domain.generation import (
    GenerationEvent,
    GenerationRequest,
    PrefillStarted,
    TextDelta,
)
from tests.cache_header import checked, checked_header, header_fields
from tests.unit.api_fakes import MODEL, FakeTokenizer, fake_container
from tests.unit.test_cache_header import FIRST, TURN2, CachingEngine


class LateEngine(CachingEngine):
    """Looks each request up ``delay`` seconds after it arrives, on a thread of its own, as
    a queued request or one waiting for another's prefill is; ``meanwhile`` runs first
    (another request keeping blocks while this one waits)."""

    def __init__(self, delay: float, meanwhile: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.delay, self.meanwhile = delay, meanwhile

    def submit(self, request: GenerationRequest, emit: Callable[[GenerationEvent], None]) -> int:
        def later() -> None:
            time.sleep(self.delay)
            if self.meanwhile is not None:
                self.meanwhile()
            CachingEngine.submit(self, request, emit)

        threading.Thread(target=later, daemon=True).start()
        return len(self.submitted) + 1


def test_the_report_is_made_before_prefill_started_goes_on_and_keepalives_wait() -> None:
    seen: list[object] = []

    async def events():
        for event in (None, None, PrefillStarted(5, 9, CachedPrefix(5, 9)), TextDelta("x")):
            yield event

    def make(started: PrefillStarted) -> CacheReport:
        return CacheReport(started.prompt_tokens, started.cached_tokens, "hot", False)

    async def run(hold: float) -> list[object]:
        seen.clear()
        out = []
        async for event in reported(events(), make, seen.append, hold):
            out.append((type(event).__name__, len(seen)))
        return out

    # Held: the keepalives before the report are dropped; the report is noted first.
    assert anyio.run(run, 60.0) == [("PrefillStarted", 1), ("TextDelta", 1)]
    # Past the hold, a keepalive goes (the response starts, its report pending).
    assert anyio.run(run, 0.0) == [
        ("NoneType", 0),
        ("NoneType", 0),
        ("PrefillStarted", 1),
        ("TextDelta", 1),
    ]


def test_a_prefix_kept_while_the_request_waited_is_in_its_header_as_in_its_usage() -> None:
    """The probe at arrival saw nothing; by its lookup another request had kept the prefix:
    the header says what the request restored, streamed or not."""
    prompt = list(FakeTokenizer().apply_chat_template(TURN2).encode())  # as the pipeline renders
    engine = LateEngine(0.2)
    engine.meanwhile = lambda: engine.prefix_cache.store(prompt, list(prompt))
    with TestClient(create_app(fake_container(engine))) as client:
        whole = client.post("/v1/chat/completions", json={"model": MODEL, "messages": TURN2})
        assert engine.submitted[0].cache_probe.tokens == 0  # nothing held on arrival
        assert int(checked(whole)["cached"]) == len(prompt) - 1  # a full hit, from the wait
        engine.prefix_cache.clear()
        body = {"model": MODEL, "messages": TURN2, "stream": True}
        body["stream_options"] = {"include_usage": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            usage = _stream_usage(r)
            fields = checked_header(r.headers, usage["prompt_tokens_details"]["cached_tokens"])
        assert int(fields["cached"]) == len(prompt) - 1


def test_a_stream_queued_past_the_hold_starts_with_its_report_pending(monkeypatch) -> None:
    from omlx.app.api.openai import controller

    monkeypatch.setattr(controller, "KEEPALIVE_SECONDS", 0.05)
    engine = LateEngine(0.4)
    container = fake_container(engine)
    with TestClient(create_app(container)) as client:
        (served,) = container.pool.loaded()
        served.chat.report_hold_s = 0.1
        body = {"model": MODEL, "messages": FIRST, "stream": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert header_fields(r.headers["x-omlx-cache"]) == {"outcome": "pending"}
            assert b": keepalive" in r.read()  # it started before the lookup
        recent = client.get("/v1/cache/recent").json()["data"]
        assert recent[0]["outcome"] == "new_conversation"  # known later, and kept


def _stream_usage(r) -> dict:
    usage = None
    for line in r.iter_lines():
        if line.startswith("data: {"):
            chunk = json.loads(line[len("data: ") :])
            usage = chunk.get("usage") or usage
    assert usage is not None
    return usage


def test_a_turn_whose_look_alike_is_still_running_is_no_eviction() -> None:
    """Two first turns sent together on one long system prompt: each finds the other as its
    closest previous prompt, which was not computed yet when it ran: neither was evicted."""
    system = {"role": "system", "content": "You are an agent. " * 20}
    engine = LateEngine(0.3)
    with TestClient(create_app(fake_container(engine))) as client:

        def ask(task: str) -> dict[str, str]:
            body = {"model": MODEL, "messages": [system, {"role": "user", "content": task}]}
            return checked(client.post("/v1/chat/completions", json=body))

        reports: list[dict[str, str]] = []
        threads = [
            threading.Thread(target=lambda t=t: reports.append(ask(t)))
            for t in ("Explore the tests.", "Review the code.")
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert [r["outcome"] for r in reports] == ["new_conversation"] * 2, reports
