"""``x-omlx-cache`` on every chat API, streamed or not, and no-store, over a real prefix cache.

The engine is a fake that runs each request through a real ``PrefixCache`` session (the
fake codec's cache is the token list itself), so what the header reports is what the
cache held, and no-store's "keeps nothing" is checked on the cold tier's writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.domain.generation import (
    Finished,
    GenerationEvent,
    GenerationRequest,
    PrefillStarted,
    TextDelta,
)
from tests.cache_header import checked, header_fields
from tests.fakes import FakeColdSource
from tests.unit.api_fakes import MODEL, fake_container
from tests.unit.test_prefix_cache import make


class CachingEngine:
    """Runs each request through the prefix cache: look up, restore, 'prefill', keep."""

    def __init__(self, block_size: int = 8, hot_bytes: int = 1 << 30, cold: bool = True) -> None:
        self.cold = FakeColdSource()
        self.prefix_cache = make(
            block_size, hot_bytes, cold=self.cold if cold else None, server_id="here"
        )
        self.submitted: list[GenerationRequest] = []
        self.active = self.queued = 0
        self.kv_token_capacity: int | None = None
        self.last_submitted = 0.0

    def submit(self, request: GenerationRequest, emit: Callable[[GenerationEvent], None]) -> int:
        self.submitted.append(request)
        tokens = list(request.prompt_tokens)
        session = self.prefix_cache.begin(  # as the engine's admission does
            tokens,
            store=request.cache_store,
            tenant=request.cache_tenant,
            probed=request.cache_probe,
        )
        session.restore()
        cached = session.cached_tokens
        emit(PrefillStarted(cached, len(tokens), session.restored()))
        session.finished(tokens, list(tokens))
        emit(TextDelta("ok"))
        emit(Finished("stop", len(tokens), 1, cached))
        return len(self.submitted)

    def cancel(self, job_id: int) -> None:
        pass


fields = header_fields


SYSTEM = {"role": "system", "content": "You are a careful assistant who answers briefly."}
FIRST = [SYSTEM, {"role": "user", "content": "What is the capital of France, please?"}]
TURN2 = [
    *FIRST,
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And Spain?"},
]


@pytest.fixture
def app() -> tuple[TestClient, CachingEngine]:
    engine = CachingEngine()
    with TestClient(create_app(fake_container(engine))) as client:
        yield client, engine


def chat(client: TestClient, messages: list[dict[str, Any]], **extra: Any) -> Any:
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, **extra})
    assert r.status_code == 200, r.text
    checked(r)  # the header's cached is usage's
    return r


def test_a_turn_hashes_its_prompt_and_asks_the_disk_tier_once_before_its_engine(
    app, monkeypatch
) -> None:
    """The report's probe (``x-omlx-cache``) and the engine's lookup share one hash of the
    prompt and one question to the disk tier's index."""
    from omlx.domain.cache import matcher, probe

    client, engine = app
    chat(client, TURN2)
    engine.prefix_cache.clear()  # the next turn's prefix is on disk only
    hashed: list[int] = []
    for module, name in (
        (probe, "chain_keys"),
        (matcher, "chain_keys"),
        (matcher, "iter_chain_keys"),
    ):
        real = getattr(module, name)

        def counted(parent, tokens, block_size, _real=real):
            hashed.append(len(tokens))
            return _real(parent, tokens, block_size)

        monkeypatch.setattr(module, name, counted)
    cold = engine.cold
    asked = len(cold.rows_calls), len(cold.children_calls)
    reply = chat(client, [*TURN2, {"role": "user", "content": "And of Spain?"}])
    assert int(fields(reply.headers["x-omlx-cache"])["cached"]) > 0
    assert len(hashed) == 1  # by the probe; the engine's lookup reused its keys
    assert len(cold.rows_calls) - asked[0] == 1  # one question for the chain's rows
    assert len(cold.children_calls) - asked[1] == 1  # one listing where the blocks end
    # (Storing the turn's new blocks then asks which are on disk: the write path, once
    # per chunk, after the lookup.)
    assert cold.batch_rows[-1]  # the engine's read was handed the probe's rows


def test_a_cold_turn_then_a_follow_up_name_where_the_prompt_left_the_cache(app) -> None:
    client, _ = app
    cold = fields(chat(client, FIRST).headers["x-omlx-cache"])
    assert cold == {
        "cached": "0",
        "tier": "none",
        "outcome": "new_conversation",  # a first turn: not a miss
        "diverged_at": "0",
        "message": "0",
        "role": "system",
    }
    follow = fields(chat(client, TURN2).headers["x-omlx-cache"])
    assert follow["tier"] == "hot" and int(follow["cached"]) > 40
    assert follow["computed_by"] == "here"  # this server's own blocks
    # The first turn's prompt ended with the generation prompt "<assistant>": the cache
    # holds it (this fake keeps no answer), and the new assistant message is where the
    # prompt goes on past everything stored.
    assert (follow["message"], follow["role"], follow["outcome"]) == ("2", "assistant", "extended")
    assert follow["diverged_at"] == follow["cached"]
    again = fields(chat(client, TURN2).headers["x-omlx-cache"])
    assert again == {
        "cached": again["cached"],
        "tier": "hot",
        "computed_by": "here",
        "outcome": "hit",
    }
    hits = {
        line.split("{")[1].split("}")[0]: float(line.split()[-1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith("omlx_cache_hit_tokens_total{")
    }
    restored = int(follow["cached"]) + int(again["cached"])
    assert hits[f'model="{MODEL}",origin="self",tier="hot"'] == restored
    assert sum(hits.values()) == restored  # no peer's, none from disk


@pytest.mark.parametrize(
    ("change", "message", "role"),
    [
        (lambda m: [{"role": "system", "content": "You are terse."}, *m[1:]], "0", "system"),
        (
            lambda m: [m[0], {"role": "user", "content": "What is the capital of Italy?"}, *m[2:]],
            "1",
            "user",
        ),
        (lambda m: [*m[:2], {"role": "assistant", "content": "Lyon."}, m[3]], "2", "assistant"),
    ],
    ids=["system prompt", "first user turn", "earlier answer"],
)
def test_the_header_names_the_message_that_changed(app, change, message, role) -> None:
    client, _ = app
    chat(client, TURN2)
    changed = fields(chat(client, change(TURN2)).headers["x-omlx-cache"])
    assert (changed["message"], changed["role"]) == (message, role)


def test_a_changed_tool_list_is_named_by_explain(app) -> None:
    client, _ = app
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
    other = {"type": "function", "function": {"name": "write", "parameters": {"type": "object"}}}
    chat(client, TURN2, tools=[tool])
    r = client.post("/v1/cache/explain", json={"model": MODEL, "messages": TURN2, "tools": [other]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["message"], body["part"], body["diverged_at"]) == (0, "tools", len("<tools>"))
    assert body["excerpt"]["prompt"].startswith("write") and body["excerpt"]["cached"].startswith(
        "read"
    )


def test_streamed_answers_and_every_api_carry_the_header(app) -> None:
    client, _ = app
    with client.stream(
        "POST", "/v1/chat/completions", json={"model": MODEL, "messages": FIRST, "stream": True}
    ) as r:
        assert fields(r.headers["x-omlx-cache"])["tier"] == "none"
        list(r.iter_lines())
    anthropic = client.post(
        "/v1/messages",
        json={"model": MODEL, "max_tokens": 8, "system": SYSTEM["content"], "messages": TURN2[1:]},
    )
    header = fields(anthropic.headers["x-omlx-cache"])
    assert header["tier"] == "hot" and header["role"] == "assistant"
    responses = client.post(
        "/v1/responses", json={"model": MODEL, "input": "Hello there", "stream": True}
    )
    header = fields(responses.headers["x-omlx-cache"])
    assert int(header["cached"]) <= 1 and header["role"] == "user"  # "<" is shared, token-exact
    done = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello there, friend"})
    assert set(checked(done)) == {"cached", "tier", "outcome", "diverged_at"}


def test_no_store_by_header_or_field_restores_and_writes_nothing(app) -> None:
    client, engine = app
    chat(client, FIRST)
    puts, blocks = list(engine.cold.puts), len(engine.prefix_cache.hot)
    r = chat(client, TURN2, omlx_cache_control="no-store")
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # it restored
    assert fields(r.headers["x-omlx-cache"])["store"] == "no"
    r = client.post(
        "/v1/messages",
        headers={"x-omlx-cache-control": "no-store"},
        json={
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "new words"}],
        },
    )
    assert r.status_code == 200
    assert engine.cold.puts == puts and len(engine.prefix_cache.hot) == blocks
    assert [s.cache_store for s in engine.submitted] == [True, False, False]


def test_an_unknown_cache_control_value_is_a_400_naming_it(app) -> None:
    client, engine = app
    r = client.post(
        "/v1/chat/completions",
        headers={"x-omlx-cache-control": "no-cache"},
        json={"model": MODEL, "messages": FIRST},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-omlx-cache-control"
    r = client.post(
        "/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 8,
            "messages": FIRST[1:],
            "omlx_cache_control": "never",
        },
    )
    assert r.status_code == 400 and "omlx_cache_control" in r.json()["error"]["message"]
    assert engine.submitted == []


def test_pins_over_http_are_listed_protected_and_deleted(app) -> None:
    client, engine = app
    chat(client, TURN2)
    r = client.post("/v1/cache/pins", json={"model": MODEL, "messages": TURN2, "ttl_seconds": 600})
    assert r.status_code == 201, r.text
    pin = r.json()
    assert pin["held_blocks"] == pin["blocks"] > 0 and pin["source"] == "api"
    listed = client.get("/v1/cache/pins").json()["data"]
    assert [p["id"] for p in listed] == [pin["id"]]
    key = engine.prefix_cache.pins.pins()[0].keys[0]
    assert engine.prefix_cache.is_pinned(key)  # the cold tier's eviction asks this too
    assert (
        client.post(
            "/v1/cache/pins", json={"model": MODEL, "prompt": "x", "ttl_seconds": -1}
        ).status_code
        == 400
    )
    assert client.delete(f"/v1/cache/pins?id={pin['id']}").json()["deleted"] is True
    assert client.delete(f"/v1/cache/pins/{pin['id']}").status_code == 404
    assert not engine.prefix_cache.is_pinned(key)


def test_explain_runs_nothing_and_reads_prompts_of_each_shape(app) -> None:
    client, engine = app
    chat(client, FIRST)
    anthropic = client.post(
        "/v1/cache/explain",
        json={
            "model": MODEL,
            "system": SYSTEM["content"],
            "messages": [{"role": "user", "content": "Hi"}],
        },
    ).json()
    assert (anthropic["message"], anthropic["role"], anthropic["tier"]) == (1, "user", "hot")
    raw = client.post(
        "/v1/cache/explain", json={"model": MODEL, "prompt": "<system>You are"}
    ).json()
    assert raw["cached_tokens"] == len("<system>You are") - 1 and raw["full_hit"]
    assert client.post("/v1/cache/explain", json={"model": MODEL}).status_code == 400
    assert len(engine.submitted) == 1


def test_recent_reports_are_listed_newest_first_for_a_dashboard(app) -> None:
    client, _ = app
    chat(client, FIRST)
    chat(client, TURN2)
    recent = client.get("/v1/cache/recent").json()["data"]
    assert [r["route"] for r in recent] == ["/v1/chat/completions"] * 2
    assert recent[0]["model"] == MODEL and recent[0]["role"] == "assistant"
    assert recent[1]["cached_tokens"] == 0 and recent[1]["tier"] == "none"


def test_the_session_a_request_names_is_reported_never_acted_on(app) -> None:
    client, engine = app
    chat(client, FIRST)
    named = client.post(
        "/v1/chat/completions",
        headers={"X-Session-ID": "conv-7", "X-SMG-Routing-Key": "r-9"},
        json={"model": MODEL, "messages": TURN2, "prompt_cache_key": "p-1"},
    )
    plain = chat(client, TURN2, prompt_cache_key="p-1")
    assert named.json()["choices"] == plain.json()["choices"]
    assert "conv-7" not in named.headers["x-omlx-cache"]  # a client's value stays out of it
    assert engine.submitted[1].session == "conv-7" and engine.submitted[2].session == "p-1"
    timed = [replace(r, render_seconds=0.0, grammar_seconds=0.0) for r in engine.submitted[1:]]
    assert timed[0] == timed[1]  # the same request but for its session (never compared)
    client.post(
        "/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 8,
            "metadata": {"user_id": "user_abc_session_42"},
            "messages": FIRST[1:],
        },
    )
    recent = client.get("/v1/cache/recent").json()["data"]
    assert [(r["session"], r["session_source"]) for r in recent[:3]] == [
        ("user_abc_session_42", "metadata.user_id"),
        ("p-1", "prompt_cache_key"),
        ("conv-7", "x-session-id"),
    ]
    assert recent[1]["computed_by"] == "here" and recent[3]["session"] is None
    explained = client.post(
        "/v1/cache/explain",
        headers={"x-smg-routing-key": "r-9"},
        json={"model": MODEL, "messages": TURN2},
    ).json()
    assert (explained["session"], explained["computed_by"]) == ("r-9", "here")
    requests = client.get("/v1/dashboard/state").json()["requests"]
    assert [r["session"] for r in requests] == ["user_abc_session_42", "p-1", "conv-7", ""]


def test_a_malformed_session_key_is_a_400_naming_its_source(app) -> None:
    client, engine = app
    r = client.post(
        "/v1/chat/completions",
        headers={"x-session-id": "s" * 600},
        json={"model": MODEL, "messages": FIRST},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-session-id"
    r = client.post(
        "/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 8,
            "metadata": {"user_id": "a\nb"},
            "messages": FIRST[1:],
        },
    )
    assert r.status_code == 400 and "metadata.user_id" in r.json()["error"]["message"]
    assert engine.submitted == []


def test_evicted_blocks_are_told_from_changed_tokens_in_the_header_log_and_counters(
    app, caplog
) -> None:
    client, engine = app
    chat(client, TURN2)
    # Every block goes from RAM and disk: this server kept them, so they were evicted.
    engine.prefix_cache.clear()
    engine.cold.blocks.clear()
    follow = [
        *TURN2,
        {"role": "assistant", "content": "Madrid."},
        {"role": "user", "content": "Ok"},
    ]
    caplog.set_level("DEBUG", logger="omlx.app.chat.pipeline")
    gone = fields(chat(client, follow).headers["x-omlx-cache"])
    assert (gone["cached"], gone["outcome"]) == ("0", "evicted")
    assert "was kept and has been evicted since" in caplog.text
    # A changed earlier answer is changed, where it changed: its message, not an eviction.
    chat(client, follow)
    edited = [*follow[:4], {"role": "assistant", "content": "Barcelona."}, follow[5]]
    caplog.clear()
    changed = fields(chat(client, edited).headers["x-omlx-cache"])
    assert (changed["outcome"], changed["message"], changed["role"]) == (
        "changed",
        "4",
        "assistant",
    )
    assert "evicted" not in caplog.text and "in messages[4]" in caplog.text
    metrics = client.get("/metrics").text
    assert 'omlx_cache_misses_total{part="evicted"} 1.0' in metrics
    assert 'omlx_cache_misses_total{part="messages"} 1.0' in metrics
    assert 'omlx_cache_reports_total{outcome="evicted",restored="none"} 1.0' in metrics
    assert 'omlx_cache_reports_total{outcome="changed",restored="past_preamble"} 1.0' in metrics
