"""Strict chat templates under agents' real request shapes (tests/agent_conversations.py),
through the real app: each turn's prompt tokens start with the whole previous turn's prompt,
generation prompt included, for the default (ChatML) template and the strict families
(tests/strict_templates.py). The engine is a fake that records the prompt tokens it gets."""

from __future__ import annotations

import itertools

import pytest
from litestar.testing import TestClient

from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer
from omlx.app.api.app import create_app
from tests.agent_conversations import (
    CLAUDE_CODE,
    CODEX,
    CODEX_TOOLS,
    HEADER,
    OPENAI,
    OPENAI_TOOLS,
    TOOLS,
    conversation,
    text,
)
from tests.strict_templates import FAMILIES, template_folder
from tests.unit.api_fakes import FakeEngine, FakeModel, fake_container, reply


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    folder = template_folder(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, load_tokenizer(folder)


def run(family, send) -> list[list[int]]:
    """Each turn's prompt tokens as the engine got them; ``send(client, turn)`` posts turn k."""
    name, tokenizer = family
    engine = FakeEngine(reply("ok"))
    model = FakeModel(tokenizer=tokenizer, model_id=name)
    with TestClient(create_app(fake_container(engine, model=model))) as client:
        for turn in itertools.count():
            response = send(client, turn)
            if response is None:
                break
            assert response.status_code == 200, response.text
    return [r.prompt_tokens for r in engine.submitted]


def assert_each_turn_extends_the_previous(prompts, tokenizer, texts) -> None:
    for n, (before, after) in enumerate(itertools.pairwise(prompts), start=1):
        assert after[: len(before)] == before, (
            f"turn {n + 1} rewrote turn {n}'s prompt from token "
            f"{next(i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b)}:\n"
            f"{tokenizer.decode(before)!r}\n{tokenizer.decode(after)!r}"
        )
    last = tokenizer.decode(prompts[-1])
    for t in texts:  # every message reached the model
        assert t in last, t


def test_claude_code_turns_each_extend_the_previous_prompt(family):
    def send(client, k):
        if k == len(CLAUDE_CODE):
            return None
        body = {
            "model": "claude-opus-5-5",
            "max_tokens": 8,
            "system": [text(HEADER), text("You are an agent.")],
            "messages": conversation(CLAUDE_CODE, k),
            "tools": TOOLS,
        }
        return client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})

    prompts = run(family, send)
    assert len(prompts) == len(CLAUDE_CODE)
    texts = ["You are an agent.", "Working directory: /w", "Tool loaded.", "Plan mode is off."]
    texts += ["Todo list empty", "Now test negatives", "Git status: modified", "return a + b"]
    assert_each_turn_extends_the_previous(prompts, family[1], texts)


def test_openai_system_messages_mid_conversation_each_extend_the_previous_prompt(family):
    def send(client, k):
        if k == len(OPENAI):
            return None
        body = {
            "model": family[0],
            "max_tokens": 8,
            "messages": conversation(OPENAI, k),
            "tools": OPENAI_TOOLS,
        }
        return client.post("/v1/chat/completions", json=body)

    prompts = run(family, send)
    assert len(prompts) == len(OPENAI)
    texts = ["You are a coding agent.", "cwd: /w", "Note", "hurry", "Approval mode: never"]
    texts += ["Now the docs", "Session ends", "b.py"]
    assert_each_turn_extends_the_previous(prompts, family[1], texts)


def test_codex_developer_messages_mid_session_each_extend_the_previous_prompt(family):
    def send(client, k):
        if k == len(CODEX):
            return None
        body = {
            "model": family[0],
            "instructions": "You are Codex.",
            "input": conversation(CODEX, k),
            "tools": CODEX_TOOLS,
            "max_output_tokens": 8,
            "store": False,
        }
        return client.post("/v1/responses", json=body)

    prompts = run(family, send)
    assert len(prompts) == len(CODEX)
    texts = ["You are Codex.", "workspace-write", "cwd /w", "Approval policy: never"]
    texts += ["<turn_aborted/>", "Docs", "Success", "Thanks"]
    assert_each_turn_extends_the_previous(prompts, family[1], texts)
