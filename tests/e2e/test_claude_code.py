"""Claude Code's request shapes through the official anthropic SDK against a real server:
its per-session billing header must not cost a new session its system prompt and tools."""

from __future__ import annotations

import anthropic

from tests.agent_model import REPLY
from tests.server_process import ServerProcess

TOOLS = [
    {
        "name": f"Tool{i}",
        "description": f"Tool number {i}: it reads files, runs commands and reports what it found. "
        * 4,
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "where"}},
        },
    }
    for i in range(12)
]
SYSTEM_PROMPT = "You are an agent working with the user toward their goals. " * 40


def session(server: ServerProcess, cch: str, question: str) -> anthropic.types.Message:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    return client.messages.create(
        model="claude-opus-5-5",
        max_tokens=4096,
        system=[
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.332.{cch}; cc_entrypoint=cli; cch={cch};",
            },
            {"type": "text", "text": SYSTEM_PROMPT, "cache_control": {"type": "ephemeral"}},
        ],
        tools=TOOLS,
        messages=[
            {"role": "user", "content": question},
            {"role": "system", "content": "# Environment\nPrimary working directory: /tmp/project"},
        ],
        thinking={"type": "adaptive", "display": "omitted"},
        extra_body={
            "output_config": {"effort": "medium"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        },
    )


def prompt_tokens(message: anthropic.types.Message) -> int:
    usage = message.usage
    written = usage.cache_creation_input_tokens or 0  # before the last cache_control breakpoint
    return usage.input_tokens + written + (usage.cache_read_input_tokens or 0)


def test_a_new_session_reuses_system_prompt_and_tools_despite_its_new_billing_header(agent_server):
    first = session(agent_server, "a1b2c", "What does this project do?")
    second = session(agent_server, "9f8e7", "Where are the tests?")
    assert second.content[-1].text == REPLY
    shared = second.usage.cache_read_input_tokens
    # everything up to the user's question: the system prompt and the tool definitions
    assert shared >= 0.9 * (prompt_tokens(second) - 40), (shared, prompt_tokens(second))
    assert prompt_tokens(first) - 40 < prompt_tokens(second) < prompt_tokens(first) + 40


def test_without_the_normalization_the_header_busts_the_prefix(agent_model_dir, tmp_path):
    with ServerProcess(
        "--model", str(agent_model_dir), "--no-prompt-normalization", cache_dir=tmp_path / "cache"
    ) as server:
        session(server, "a1b2c", "What does this project do?")
        second = session(server, "9f8e7", "Where are the tests?")
        client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
        ask = [{"role": "user", "content": "x"}]
        system = client.messages.count_tokens(model="claude-x", system=SYSTEM_PROMPT, messages=ask)
        bare = client.messages.count_tokens(model="claude-x", messages=ask)
    # this template renders the tools first; the header, then, costs the system prompt and on
    system_tokens = system.input_tokens - bare.input_tokens
    assert system_tokens > 300
    lost = prompt_tokens(second) - second.usage.cache_read_input_tokens
    assert lost > system_tokens, (lost, system_tokens)
