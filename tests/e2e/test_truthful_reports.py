"""``x-omlx-cache`` against a real server and the official clients: the header says what
usage does on every API, streamed or not, and names what happened: a first turn is a new
conversation, an ordinary follow-up goes on at its new message (not in the answer before
it), a changed system prompt is changed, where it changed, not evicted."""

from __future__ import annotations

import random
from typing import Any

import anthropic
import httpx
import openai

from tests.agent_model import MODEL_ID
from tests.cache_header import checked, checked_header
from tests.server_process import ServerProcess


def system_prompt() -> str:
    """A system prompt no other test on the shared server sends."""
    rng = random.Random()
    words = ["cache", "prefix", "turn", "agent", "block", "tier", "token", "report"]
    return "You work on " + " ".join(rng.choice(words) for _ in range(150)) + "."


def chat(server: ServerProcess, messages: list[dict[str, Any]]) -> tuple[Any, dict[str, str]]:
    """A whole answer and its checked header fields."""
    sdk = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL_ID, messages=messages, max_tokens=32, temperature=0
    )
    return raw.parse(), checked(raw)


def streamed(server: ServerProcess, messages: list[dict[str, Any]]) -> dict[str, str]:
    """A streamed answer's header fields, checked against the usage its last chunk brings."""
    sdk = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL_ID,
        messages=messages,
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in raw.parse() if c.usage is not None][-1]
    return checked_header(raw.headers, usage.prompt_tokens_details.cached_tokens)


def test_the_header_says_what_usage_does_and_names_what_happened(agent_server) -> None:
    system = system_prompt()
    first = [{"role": "system", "content": system}, {"role": "user", "content": "List the files."}]
    answer, cold = chat(agent_server, first)
    assert (cold["outcome"], cold["message"]) == ("new_conversation", "0")  # not a miss

    said = answer.choices[0].message
    follow_up = [
        *first,
        {"role": "assistant", "content": said.content, "reasoning_content": said.reasoning_content},
        {"role": "user", "content": "And the tests?"},
    ]
    follow = streamed(agent_server, follow_up)
    # The cache holds the first prompt and its answer: the prompt goes on at the new
    # message (index 3), not in the answer's end-of-turn token.
    assert (follow["outcome"], follow["message"], follow["role"]) == ("extended", "3", "user")
    assert int(follow["cached"]) > 100 and follow["tier"] == "hot"

    edited = [{"role": "system", "content": system.replace("You work on", "You work in")}]
    changed = streamed(agent_server, [*edited, *follow_up[1:]])
    assert (changed["outcome"], changed["message"], changed["role"]) == ("changed", "0", "system")

    # The Anthropic and Responses APIs (asking the first turn again: a full hit), and a raw
    # completion, say what their usage does too.
    claude = anthropic.Anthropic(base_url=agent_server.base_url, api_key="unused", max_retries=0)
    with claude.messages.with_streaming_response.create(
        model=MODEL_ID,
        max_tokens=32,
        system=system,
        messages=first[1:],
        stream=True,
    ) as raw:
        lines = [line for line in raw.iter_lines() if '"cache_read_input_tokens"' in line]
        read = int(lines[-1].split('"cache_read_input_tokens":')[1].split(",")[0].strip("}"))
        assert checked_header(raw.headers, read)["outcome"] == "hit"
    responses = httpx.post(
        agent_server.base_url + "/v1/responses",
        json={"model": MODEL_ID, "instructions": system, "input": first[1:]},
        timeout=120,
    )
    assert checked(responses)["outcome"] == "hit"
    raw_prompt = httpx.post(
        agent_server.base_url + "/v1/completions",
        json={"model": MODEL_ID, "prompt": "Once upon a time " * 20, "max_tokens": 4},
        timeout=120,
    )
    checked(raw_prompt)
