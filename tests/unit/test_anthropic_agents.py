"""What current Claude Code sends to /v1/messages, over a fake engine: every shape accepted,
its volatile billing header normalized away, its thinking carried across turns, diagnostics."""

from __future__ import annotations

import json

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from tests.unit.api_fakes import FakeEngine, fake_container, reply

HEADER = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch=1f2e3;"
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"


def claude_code_body(text: str = "say hi", header: str = HEADER, **extra) -> dict:
    """The shape of Claude Code 2.1's first request (its own words replaced by ours)."""
    return {
        "model": "claude-opus-5-5",
        "max_tokens": 32000,
        "stream": False,
        "system": [
            {"type": "text", "text": header},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<reminder>be kind</reminder>"},
                    {"type": "text", "text": text},
                ],
            },
            {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": "# Environment\ncwd: /tmp",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Run a command",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
            {
                "name": "Later",
                "description": "Found by tool search",
                "input_schema": {"type": "object"},
                "defer_loading": True,
            },
            {"name": "web_search", "type": "web_search_20250305"},
        ],
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "some_future_field": {"anything": True},
        **extra,
    }


def post(c: TestClient, body: dict, betas: str = BETAS):
    return c.post(
        "/v1/messages?beta=true",
        json=body,
        headers={"anthropic-beta": betas, "anthropic-version": "2023-06-01"},
    )


def prompt_of(engine: FakeEngine, i: int = -1) -> str:
    return bytes(engine.submitted[i].prompt_tokens).decode()


def test_claude_code_s_request_is_accepted_and_rendered_without_its_billing_header():
    engine = FakeEngine(reply("<think>hmm</think>", "Hello."))
    with TestClient(create_app(fake_container(engine))) as c:
        r = post(c, claude_code_body())
        metrics = c.get("/metrics").text
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "claude-opus-5-5"  # answered by the claude-* alias
    assert prompt_of(engine).splitlines() == [
        "<tools>Bash",  # the deferred tool waits for tool search; the server tool is left out
        "<system>You are an agent.",
        "<user><reminder>be kind</reminder>",
        "say hi",
        "<system># Environment",
        "cwd: /tmp",
        "<assistant>",
    ]
    thinking, text = body["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == ""  # display: omitted
    assert thinking["signature"] and text == {"type": "text", "text": "Hello."}
    assert 'omlx_prompt_normalizations_total{rule="claude_code_billing_header"} 1.0' in metrics


def test_sealed_thinking_sent_back_renders_as_the_model_wrote_it():
    engine = FakeEngine(reply("<think>hmm</think>", "Hello."))
    with TestClient(create_app(fake_container(engine))) as c:
        first = post(c, claude_code_body()).json()
        body = claude_code_body()
        body["messages"] += [
            {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": "and now?"},
        ]
        assert post(c, body).status_code == 200
        forged = claude_code_body()
        forged["messages"] += [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": "omlx1.AAAA.BBBB.CCCC"},
                    {"type": "text", "text": "Hello."},
                ],
            },
            {"role": "user", "content": "and now?"},
        ]
        assert post(c, forged).status_code == 200
    assert "<assistant><think>hmm</think>Hello." in prompt_of(engine, 1)
    assert "<assistant>Hello." in prompt_of(
        engine, 2
    )  # a signature we did not seal opens to nothing


def test_clear_thinking_keeps_only_the_recent_turns_thinking():
    engine = FakeEngine(reply("ok"))
    turns = []
    for n in range(3):
        turns += [
            {"role": "user", "content": f"q{n}"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"t{n}", "signature": "x"},
                    {"type": "text", "text": f"a{n}"},
                ],
            },
        ]
    body = {
        "model": "claude-x",
        "max_tokens": 5,
        "messages": [*turns, {"role": "user", "content": "q3"}],
        "context_management": {
            "edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
            ]
        },
    }
    with TestClient(create_app(fake_container(engine))) as c:
        assert post(c, body).status_code == 200
    prompt = prompt_of(engine)
    assert (
        "<assistant>a0" in prompt and "<assistant>a1" in prompt and "<think>t2</think>a2" in prompt
    )


def test_a_tool_reference_loads_a_deferred_tool_where_it_is_referenced():
    engine = FakeEngine(reply("ok"))
    body = claude_code_body()
    body["messages"] += [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "ToolSearch",
                    "input": {"query": "select:Later"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "tool_reference", "tool_name": "Later"}],
                }
            ],
        },
    ]
    with TestClient(create_app(fake_container(engine))) as c:
        assert post(c, body).status_code == 200
        body["messages"][-1]["content"][0]["content"][0]["tool_name"] = "Nope"
        refused = post(c, body)
    assert '<tool>{"type": "function", "function": {"name": "Later"' in prompt_of(engine)
    assert refused.status_code == 400 and "Nope" in refused.json()["error"]["message"]


def test_diagnostics_name_what_changed_since_the_previous_message():
    engine = FakeEngine(reply("Hello."))
    beta = BETAS + ",cache-diagnosis-2026-04-07"
    with TestClient(create_app(fake_container(engine))) as c:
        first = post(c, claude_code_body(diagnostics={"previous_message_id": None}), beta).json()
        assert first["diagnostics"] == {"cache_miss_reason": None}
        follow = claude_code_body(diagnostics={"previous_message_id": first["id"]})
        follow["messages"] += [
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "more"},
        ]
        assert post(c, follow, beta).json()["diagnostics"] == {"cache_miss_reason": None}
        edited = claude_code_body(diagnostics={"previous_message_id": first["id"]})
        edited["system"][1]["text"] = "You are another agent."
        reason = post(c, edited, beta).json()["diagnostics"]["cache_miss_reason"]
        assert reason["type"] == "system_changed" and reason["cache_missed_input_tokens"] > 0
        unknown = post(c, claude_code_body(diagnostics={"previous_message_id": "msg_nope"}), beta)
        assert unknown.json()["diagnostics"] == {
            "cache_miss_reason": {"type": "previous_message_not_found"}
        }
        streamed = post(
            c, claude_code_body(stream=True, diagnostics={"previous_message_id": first["id"]}), beta
        )
        start = json.loads(streamed.text.split("data: ", 1)[1].split("\n", 1)[0])
        assert start["message"]["diagnostics"] == {"cache_miss_reason": None}
        plain = post(c, claude_code_body()).json()
        metrics = c.get("/metrics").text
    assert "diagnostics" not in plain  # only with the beta
    assert 'omlx_cache_misses_total{part="system"} 1.0' in metrics


def test_streamed_thinking_is_sealed_in_a_signature_delta():
    engine = FakeEngine(reply("<think>hmm</think>", "Hello."))
    with TestClient(create_app(fake_container(engine))) as c:
        omitted = post(c, claude_code_body(stream=True)).text
        shown = post(
            c, claude_code_body(stream=True, thinking={"type": "enabled", "budget_tokens": 1024})
        ).text

    def deltas(text):
        return [
            json.loads(line[6:])["delta"]
            for line in text.splitlines()
            if line.startswith("data: ") and '"content_block_delta"' in line
        ]

    assert [d["type"] for d in deltas(omitted)] == ["signature_delta", "text_delta"]
    assert [d["type"] for d in deltas(shown)] == ["thinking_delta", "signature_delta", "text_delta"]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"thinking": {"type": "sometimes"}}, "thinking"),
        ({"output_config": {"effort": "extreme"}}, "effort"),
        ({"mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers"),
    ],
)
def test_what_omlx_cannot_honour_is_a_400_naming_it(change, fragment):
    with TestClient(create_app(fake_container(FakeEngine()))) as c:
        r = post(c, claude_code_body(**change))
    assert r.status_code == 400 and fragment in r.json()["error"]["message"]
