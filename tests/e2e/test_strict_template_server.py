"""A real server on the tiny model with a Mistral-style strict template (system first only,
strict alternation), driven by the official anthropic client through Claude Code's turns:
each follow-up restores the whole previous prompt (``x-omlx-cache: cached=``), late system
messages and reminders beside tool results included."""

from __future__ import annotations

import anthropic
import pytest

from tests.agent_conversations import CLAUDE_CODE, HEADER, TOOLS, conversation
from tests.cache_header import checked
from tests.server_process import ServerProcess
from tests.strict_templates import template_folder
from tests.tiny_model import build_tiny_model


@pytest.mark.slow  # a server of its own: about 15 s
def test_each_claude_code_turn_restores_the_whole_previous_prompt(tmp_path):
    folder = build_tiny_model(tmp_path / "model", vocab_size=512)  # room for the markers
    template_folder(folder, "mistral")
    server = ServerProcess(
        "--model",
        str(folder),
        "--block-size",
        "16",
        cache_dir=tmp_path / "cache",
        log_path=tmp_path / "server.log",
    )
    with server:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
        previous = 0
        for k in range(len(CLAUDE_CODE)):
            raw = client.messages.with_raw_response.create(
                model="claude-opus-5-5",
                max_tokens=4,
                temperature=0,
                system=[{"type": "text", "text": HEADER}, {"type": "text", "text": "Be an agent."}],
                messages=conversation(CLAUDE_CODE, k),
                tools=TOOLS,
            )
            usage = raw.parse().usage
            prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)
            header = raw.headers["x-omlx-cache"]
            cached = int(checked(raw)["cached"])  # the header says what usage does
            assert cached >= previous, f"turn {k + 1}: {header}; the previous prompt: {previous}"
            previous = prompt
        assert "refuses system messages after the first user message" in server.read_log()
