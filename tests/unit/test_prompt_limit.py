"""Prompts too long for the context are refused by their length, before tokenizing (issue 22 row 2)."""

from __future__ import annotations

import time

from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.chat.prompt_limit import PromptLimit, longest_token_chars
from tests.unit.api_fakes import MODEL, FakeTokenizer, fake_container

BIG = "x" * 10_000_000  # 10 MB, under the 16 MB body limit


class CountingTokenizer(FakeTokenizer):
    calls = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        CountingTokenizer.calls += 1
        return super().encode(text, add_special_tokens)


def test_the_bound_is_the_context_times_the_longest_vocabulary_entry():
    class Vocab:
        def get_vocab(self):
            return {"a": 0, "abcd": 1, "<|im_start|>": 2}

    assert longest_token_chars(Vocab()) == 12
    assert PromptLimit.of(Vocab(), 100).max_chars == 1200
    assert longest_token_chars(object()) is None
    PromptLimit(100, None).check("x" * 10**6, "messages")  # no vocabulary: no bound, no refusal


def test_a_10_mb_prompt_is_refused_in_milliseconds_without_tokenizing():
    container = fake_container()
    served = container.pool.loaded()[0]
    CountingTokenizer.calls = 0
    served.generation.tokenizer = CountingTokenizer()
    served.generation._encode = served.generation.tokenizer.encode
    bodies = {
        "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": BIG}]},
        "/v1/completions": {"model": MODEL, "prompt": BIG},
        "/v1/messages": {
            "model": MODEL,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": BIG}],
        },
        "/v1/messages/count_tokens": {
            "model": MODEL,
            "messages": [{"role": "user", "content": BIG}],
        },
        "/v1/responses": {"model": MODEL, "input": BIG},
    }
    with TestClient(create_app(container)) as c:
        for path, body in bodies.items():
            started = time.monotonic()
            r = c.post(path, json=body)
            took = time.monotonic() - started
            assert r.status_code == 400, (path, r.text)
            assert "characters" in r.json()["error"]["message"], r.text
            assert took < 5.0, (path, took)  # JSON of 10 MB dominates (tokenizing it: 35-66 s)
    assert CountingTokenizer.calls == 0


def test_a_prompt_inside_the_bound_is_served():
    with TestClient(create_app(fake_container())) as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "y" * 2000}]},
        )
    assert r.status_code == 200, r.text
