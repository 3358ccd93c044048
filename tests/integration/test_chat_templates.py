"""Real chat templates (jinja through the tokenizer mlx-lm loads) against Claude Code's shapes."""

from __future__ import annotations

import json
import logging

import pytest
from mlx_lm.utils import load_tokenizer

from omlx.app.chat.templates import ChatRenderer
from tests.tiny_model import build_tokenizer

# Like Qwen's and Llama's: a system message anywhere but first raises.
STRICT = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Like Qwen3's: reasoning of earlier turns is not rendered.
FORGETFUL = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'].split('</think>')[-1] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Claude Code's turn shape: system prompt, a user turn, then its environment as a system message.
CLAUDE_CODE_TURN = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "say hi"},
    {"role": "system", "content": "# Environment\ncwd: /tmp"},
]


def tokenizer(tmp_path, template: str):
    build_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(tmp_path)


def test_a_strict_template_renders_later_system_messages_folded(tmp_path, caplog):
    renderer = ChatRenderer(tokenizer(tmp_path, STRICT), "strict")
    with caplog.at_level(logging.INFO, logger="omlx.app.chat.templates"):
        first = renderer.render(CLAUDE_CODE_TURN)
    assert first == (
        "<|im_start|>system\nYou are an agent.<|im_end|>\n"
        "<|im_start|>user\nsay hi\n\n# Environment\ncwd: /tmp<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "refuses system messages after the first user message" in caplog.text
    # the next turn folds the same way, so it starts with the first turn's prompt and answer
    second = renderer.render(
        [
            *CLAUDE_CODE_TURN,
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "bye"},
        ]
    )
    assert second.startswith(first + "Hello.<|im_end|>\n")


def test_a_template_that_accepts_them_renders_them_where_they_are(tmp_path):
    from tests.tiny_model import CHAT_TEMPLATE

    text = ChatRenderer(tokenizer(tmp_path, CHAT_TEMPLATE), "open").render(CLAUDE_CODE_TURN)
    assert text.endswith(
        "<|im_start|>system\n# Environment\ncwd: /tmp<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_that_drops_earlier_reasoning_is_reported_once(tmp_path, caplog):
    tok = tokenizer(tmp_path, FORGETFUL)
    tok._think_start, tok._think_end = "<think>", "</think>"  # as a reasoning model's wrapper has
    with caplog.at_level(logging.WARNING, logger="omlx.app.chat.templates"):
        renderer = ChatRenderer(tok, "forgetful")
        renderer.render([{"role": "user", "content": "hi"}])
        renderer.render([{"role": "user", "content": "again"}])
    assert caplog.text.count("rewrites history") == 1
    assert "drops the reasoning of earlier turns" in caplog.text


def test_a_template_that_moves_the_tools_to_the_latest_user_message_is_reported(tmp_path, caplog):
    # Like Mistral Small 3.1's: the tools go right before the last user message.
    moving = (
        "{% for message in messages %}"
        "{% if message['role'] == 'user' and loop.last and tools %}"
        "{{ '[TOOLS]' + tools | tojson + '[/TOOLS]' }}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    with caplog.at_level(logging.WARNING, logger="omlx.app.chat.templates"):
        ChatRenderer(tokenizer(tmp_path, moving), "moving").render(
            [{"role": "user", "content": "hi"}]
        )
    assert "moves the tools to the latest user message" in caplog.text


@pytest.mark.parametrize("template", [STRICT, FORGETFUL])
def test_reasoning_goes_back_inline_for_templates_without_reasoning_content(tmp_path, template):
    tok = tokenizer(tmp_path, template)
    tok._think_start, tok._think_end = "<think>", "</think>"
    renderer = ChatRenderer(tok, "t")
    assert not renderer.renders_reasoning
    text = renderer.render(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "r"},
            {"role": "user", "content": "q2"},
        ]
    )
    kept = "<think>r</think>a" if template == STRICT else "a"
    assert f"<|im_start|>assistant\n{kept}<|im_end|>" in text
