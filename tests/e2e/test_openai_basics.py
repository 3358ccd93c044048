"""A real server process driven by the official openai client, and bad requests."""

from __future__ import annotations

import httpx
import openai
import pytest


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def test_default_model_answers_paris(default_server):
    c = client(default_server)
    assert [m.id for m in c.models.list().data] == ["smollm2-135m-instruct"]
    reply = c.chat.completions.create(
        model="smollm2-135m-instruct", messages=FRANCE, max_tokens=30, temperature=0
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0


def test_default_model_streams_paris(default_server):
    c = client(default_server)
    stream = c.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=FRANCE,
        max_tokens=30,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)


def test_stream_ends_with_done(tiny_server):
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    with httpx.stream(
        "POST", tiny_server.base_url + "/v1/chat/completions", json=body, timeout=60
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"


BAD_REQUESTS = [
    ("malformed json", b'{"model": "tiny-llama", "messages": [', 400),
    ("missing messages", b'{"model": "tiny-llama"}', 400),
    (
        "mistyped max_tokens",
        b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}',
        400,
    ),
    (
        "unknown role",
        b'{"model": "tiny-llama", "messages": [{"role": "wizard", "content": "x"}]}',
        400,
    ),
    ("unknown model", b'{"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}', 404),
    (
        "prompt too long",
        b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "'
        + b"word " * 3000
        + b'"}]}',
        400,
    ),
    (
        "zero max_tokens",
        b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
        400,
    ),
    (
        "n above one",
        b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "n": 3}',
        400,
    ),
    ("body not an object", b"[1, 2, 3]", 400),
]


@pytest.mark.parametrize(("name", "body", "status"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_a_4xx_in_openai_envelope(tiny_server, name, body, status):
    r = httpx.post(
        tiny_server.base_url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    # and the server keeps serving
    assert httpx.get(tiny_server.base_url + "/health", timeout=5).status_code == 200


def test_openai_client_raises_typed_errors(tiny_server):
    c = client(tiny_server)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "x"}], n=2
        )
