"""Every OpenAI-style body and stream chunk validates against OpenAI's published schemas.

Raw httpx, so nothing is smoothed over by a client: models, chat (plain, streamed,
with tool calls, with reasoning), completions (text and token ids, plain and
streamed), and the error envelope for each kind of client mistake.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.conftest import API_KEY
from tests.openai_schema_check import COMPLETION_CHUNK, problems
from tests.scripted_model import MODEL_ID as SCRIPTED

TINY = "tiny-llama"
HI = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT, CHUNK, COMPLETION, ERROR = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "ErrorResponse",
)

# (id, server, method, path, body, expected status, schema of the body or of each chunk)
CASES = [
    ("models", "tiny", "GET", "/v1/models", None, 200, "ListModelsResponse"),
    (
        "chat",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {"model": TINY, "messages": HI, "max_tokens": 5},
        200,
        CHAT,
    ),
    (
        "chat-length",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {"model": TINY, "messages": HI, "max_completion_tokens": 1},
        200,
        CHAT,
    ),
    (
        "chat-stream",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {"model": TINY, "messages": HI, "max_tokens": 5, "stream": True},
        200,
        CHUNK,
    ),
    (
        "chat-stream-usage",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {
            "model": TINY,
            "messages": HI,
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        200,
        CHUNK,
    ),
    (
        "completion",
        "tiny",
        "POST",
        "/v1/completions",
        {"model": TINY, "prompt": "The quick", "max_tokens": 5},
        200,
        COMPLETION,
    ),
    (
        "completion-ids",
        "tiny",
        "POST",
        "/v1/completions",
        {"model": TINY, "prompt": [5, 6, 7], "max_tokens": 3, "echo": True},
        200,
        COMPLETION,
    ),
    (
        "completion-stream",
        "tiny",
        "POST",
        "/v1/completions",
        {
            "model": TINY,
            "prompt": "The quick",
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        200,
        COMPLETION,
    ),
    (
        "tool-call",
        "scripted",
        "POST",
        "/v1/chat/completions",
        {"model": SCRIPTED, "messages": HI, "tools": TOOLS},
        200,
        CHAT,
    ),
    (
        "tool-call-stream",
        "scripted",
        "POST",
        "/v1/chat/completions",
        {"model": SCRIPTED, "messages": HI, "tools": TOOLS, "stream": True},
        200,
        CHUNK,
    ),
    (
        "reasoning",
        "scripted",
        "POST",
        "/v1/chat/completions",
        {"model": SCRIPTED, "messages": HI},
        200,
        CHAT,
    ),
    (
        "reasoning-stream",
        "scripted",
        "POST",
        "/v1/chat/completions",
        {"model": SCRIPTED, "messages": HI, "stream": True},
        200,
        CHUNK,
    ),
    (
        "logprobs-chat",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {"model": TINY, "messages": HI, "max_tokens": 4, "logprobs": True, "top_logprobs": 2},
        200,
        CHAT,
    ),
    (
        "logprobs-chat-stream",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {
            "model": TINY,
            "messages": HI,
            "max_tokens": 4,
            "logprobs": True,
            "top_logprobs": 2,
            "stream": True,
        },
        200,
        CHUNK,
    ),
    (
        "logprobs-completion",
        "tiny",
        "POST",
        "/v1/completions",
        {"model": TINY, "prompt": "x", "max_tokens": 4, "logprobs": 2},
        200,
        COMPLETION,
    ),
    (
        "logprobs-completion-stream",
        "tiny",
        "POST",
        "/v1/completions",
        {"model": TINY, "prompt": "x", "max_tokens": 4, "logprobs": 2, "stream": True},
        200,
        COMPLETION,
    ),
    (
        "json-schema",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {
            "model": TINY,
            "messages": HI,
            "max_tokens": 6,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object"}},
            },
        },
        200,
        CHAT,
    ),
    (
        "error-response-format",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {"model": TINY, "messages": HI, "response_format": {"type": "yaml"}},
        400,
        ERROR,
    ),
    (
        "error-unknown-model",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {"model": "gpt-17", "messages": HI},
        404,
        ERROR,
    ),
    (
        "error-invalid-field",
        "tiny",
        "POST",
        "/v1/chat/completions",
        {"model": TINY, "messages": "hi"},
        400,
        ERROR,
    ),
    (
        "error-n",
        "tiny",
        "POST",
        "/v1/completions",
        {"model": TINY, "prompt": "x", "n": 2},
        400,
        ERROR,
    ),
    ("error-no-route", "tiny", "GET", "/v1/engines", None, 404, ERROR),
    ("error-no-key", "scripted-anonymous", "GET", "/v1/models", None, 401, ERROR),
]


def _bodies(response: httpx.Response) -> list[object]:
    if not response.headers["content-type"].startswith("text/event-stream"):
        return [response.json()]
    data = [
        line.removeprefix("data: ")
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.mark.parametrize(
    ("name", "server", "method", "path", "body", "status", "schema"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_body_matches_openai_schema(
    request, tiny_server, name, server, method, path, body, status, schema
):
    base = request.getfixturevalue(
        "scripted_server" if server.startswith("scripted") else "tiny_server"
    ).base_url
    headers = {"Authorization": f"Bearer {API_KEY}"} if server == "scripted" else {}
    response = httpx.request(method, base + path, json=body, headers=headers, timeout=60)
    assert response.status_code == status, response.text
    bodies = _bodies(response)
    assert bodies
    for i, item in enumerate(bodies):
        final = i == len(bodies) - 1
        kind = (
            COMPLETION_CHUNK if schema == COMPLETION and len(bodies) > 1 and not final else schema
        )
        assert problems(kind, item) == [], json.dumps(item)
    if name.endswith("-usage"):
        assert bodies[-1]["usage"]["total_tokens"] > 0
    if name.startswith("tool-call"):
        assert "get_weather" in json.dumps(bodies)
    if name.startswith("reasoning"):
        assert "reasoning_content" in json.dumps(bodies)
    if name.startswith("logprobs"):
        found = [c["logprobs"] for b in bodies for c in b["choices"] if c.get("logprobs")]
        assert found, bodies
    if name == "json-schema":
        assert bodies[0]["choices"][0]["message"]["content"].startswith("{")
