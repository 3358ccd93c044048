"""Both APIs over a fake engine: stream shapes, errors after the start, request conversion."""

from __future__ import annotations

import json

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from tests.openai_schema_check import problems
from tests.unit.api_fakes import MODEL, FakeEngine, fails_after, fake_container, reply

HI = [{"role": "user", "content": "hi"}]
TOOL = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'


def serve(engine: FakeEngine, **settings) -> TestClient:
    return TestClient(create_app(fake_container(engine, **settings)))


def sse(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE body."""
    out, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((name, line.removeprefix("data: ")))
            name = None
    return out


def test_openai_error_mid_stream_is_a_final_data_event_then_done():
    with serve(FakeEngine(fails_after("partial"))) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = [d for _, d in sse(r.text)]
    assert data[-1] == "[DONE]"
    error = json.loads(data[-2])
    assert problems("ErrorResponse", error) == []
    assert error["error"]["message"] == "the engine fell over"
    assert json.loads(data[1])["choices"][0]["delta"] == {"content": "partial"}


def test_anthropic_error_mid_stream_is_an_error_event():
    with serve(FakeEngine(fails_after("partial"))) as c:
        r = c.post(
            "/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 5, "stream": True}
        )
    events = sse(r.text)
    assert [n for n, _ in events][:3] == ["message_start", "ping", "content_block_start"]
    name, data = events[-1]
    assert name == "error"
    assert json.loads(data) == {
        "type": "error",
        "error": {"type": "api_error", "message": "the engine fell over"},
    }


def test_plain_request_failure_is_a_500_in_each_envelope():
    with serve(FakeEngine(fails_after())) as c:
        openai = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})
        anthropic = c.post("/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 5})
    assert openai.status_code == anthropic.status_code == 500
    assert problems("ErrorResponse", openai.json()) == []
    assert anthropic.json()["error"]["type"] == "api_error"


def test_openai_stream_chunks_validate_with_reasoning_and_tool_calls():
    engine = FakeEngine(reply("<think>mm</think>", "Hi ", TOOL, TOOL))
    body = {
        "model": MODEL,
        "messages": HI,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    with serve(engine) as c:
        data = [d for _, d in sse(c.post("/v1/chat/completions", json=body).text)]
    chunks = [json.loads(d) for d in data[:-1]]
    for chunk in chunks:
        assert problems("CreateChatCompletionStreamResponse", chunk) == []
    calls = [
        tc
        for ch in chunks
        if ch["choices"]
        for tc in ch["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert [c["index"] for c in calls] == [0, 1]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_anthropic_usage_separates_cache_reads():
    with serve(FakeEngine(reply("ok", cached=16))) as c:
        body = c.post("/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 5}).json()
        events = sse(
            c.post(
                "/v1/messages",
                json={"model": MODEL, "messages": HI, "max_tokens": 5, "stream": True},
            ).text
        )
    prompt = len(b"<user>hi\n<assistant>")
    assert body["usage"] == {
        "input_tokens": prompt - 16,
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 16,
    }
    start = json.loads(events[0][1])["message"]["usage"]
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (prompt - 16, 16)


def test_anthropic_blocks_become_template_messages():
    engine = FakeEngine(reply("done"))
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "t", "signature": "s"},
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "text", "text": "and tomorrow?", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    system = [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]
    with serve(engine) as c:
        r = c.post(
            "/v1/messages",
            json={
                "model": MODEL,
                "system": system,
                "messages": messages,
                "max_tokens": 5,
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            },
        )
    assert r.status_code == 200, r.text
    prompt = bytes(engine.submitted[0].prompt_tokens).decode()
    assert prompt.splitlines() == [
        "<tools>f",
        "<system>be brief",
        "<user>weather?",
        # thinking sent back renders as the model wrote it (this template has no reasoning_content)
        '<assistant><think>t</think>checking<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
        "<tool>sunny",
        "<user>and tomorrow?",
        "<assistant>",
    ]


def test_openai_tool_history_reaches_the_template_as_dicts():
    engine = FakeEngine(reply("done"))
    messages = [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "wea"}, {"type": "text", "text": "ther?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    with serve(engine) as c:
        assert (
            c.post("/v1/chat/completions", json={"model": MODEL, "messages": messages}).status_code
            == 200
        )
    assert bytes(engine.submitted[0].prompt_tokens).decode().splitlines() == [
        "<system>be brief",
        "<user>weather?",
        '<assistant><tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
        "<tool>sunny",
        "<assistant>",
    ]


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": HI, "tool_choice": "required"},
            "needs tools",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": HI, "tool_choice": "sometimes"},
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "image_url",
        ),
        ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, "one prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, "prompt must be"),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": [{"type": "image"}]}],
                "max_tokens": 5,
            },
            "image",
        ),
        ("/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 0}, "max_tokens"),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "messages": HI,
                "max_tokens": 5,
                "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            },
            "clear_tool_uses_20250919",
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "messages": HI,
                "max_tokens": 5,
                "output_config": {"format": {"type": "xml_schema", "schema": {}}},
            },
            "output_config.format",
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "messages": HI,
                "max_tokens": 5,
                "tool_choice": {"type": "tool", "name": "x"},
            },
            "needs tools",
        ),
        ("/v1/messages", {"model": "gpt-9", "messages": HI, "max_tokens": 5}, "does not exist"),
    ],
)
def test_client_mistakes_are_4xx_in_the_route_envelope(path, body, fragment):
    with serve(FakeEngine()) as c:
        r = c.post(path, json=body)
    assert 400 <= r.status_code < 500
    message = r.json()["error"]["message"]
    assert fragment in message
    if path.startswith("/v1/messages"):
        assert r.json()["type"] == "error"
    else:
        assert problems("ErrorResponse", r.json()) == []


def test_count_tokens_renders_like_messages():
    engine = FakeEngine()
    with serve(engine) as c:
        counted = c.post(
            "/v1/messages/count_tokens", json={"model": MODEL, "messages": HI, "system": "s"}
        ).json()
        c.post(
            "/v1/messages", json={"model": MODEL, "messages": HI, "system": "s", "max_tokens": 5}
        )
    assert counted == {"input_tokens": len(engine.submitted[0].prompt_tokens)}
