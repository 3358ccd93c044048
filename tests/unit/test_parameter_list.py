"""docs/api.md's parameter tables, walked: every row is sent to its route.

A row marked refused must be a 400 naming the parameter; honoured and accepted rows must
be answered (and honoured ones that change sampling must reach the engine's request).
Every field a request Struct declares must have a row, so a new field is classified.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import TestClient

from omlx.app.api.anthropic.schemas import MessagesRequest
from omlx.app.api.app import create_app
from omlx.app.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from omlx.app.api.responses.schemas import ResponsesRequest
from omlx.domain.generation import GenerationRequest
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container, reply

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "messages": HI, "max_tokens": 4},
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 4},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"model": MODEL, "messages": HI, "max_tokens": 8},
}
STRUCTS = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
}
Check = Callable[[GenerationRequest], bool] | None


def grammar(r: GenerationRequest) -> bool:
    return r.constraint is not None


def penalties(r: GenerationRequest) -> Any:
    return r.sampling.penalties


# (route, row) -> (what to add to the base body, what the engine request must show)
COMMON: dict[str, tuple[dict[str, Any], Check]] = {
    "temperature": ({"temperature": 0.3}, lambda r: r.sampling.temperature == 0.3),
    "top_p": ({"top_p": 0.5}, lambda r: r.sampling.top_p == 0.5),
    "top_k": ({"top_k": 5}, lambda r: r.sampling.top_k == 5),
    "min_p": ({"min_p": 0.1}, lambda r: r.sampling.min_p == 0.1),
    "seed": ({"seed": 7}, lambda r: r.sampling.seed == 7),
    "stream": ({"stream": True}, None),
    "stream_options": ({"stream": True, "stream_options": {"include_usage": True}}, None),
    "presence_penalty": ({"presence_penalty": 0.5}, lambda r: penalties(r).presence == 0.5),
    "frequency_penalty": ({"frequency_penalty": 0.5}, lambda r: penalties(r).frequency == 0.5),
    "repetition_penalty": ({"repetition_penalty": 1.2}, lambda r: penalties(r).repetition == 1.2),
    "logit_bias": ({"logit_bias": {"65": 5}}, lambda r: penalties(r).logit_bias == ((65, 5.0),)),
    "user": ({"user": "u"}, None),
    "model": ({}, None),
}
NO_STORE = ({"omlx_cache_control": "no-store"}, lambda r: r.cache_store is False)
SAMPLES: dict[str, dict[str, tuple[dict[str, Any], Check]]] = {
    "/v1/chat/completions": {
        **COMMON,
        "omlx_cache_control": NO_STORE,
        "messages": ({}, None),
        "max_tokens": ({"max_tokens": 3}, lambda r: r.max_tokens == 3),
        "max_completion_tokens": ({"max_completion_tokens": 3}, lambda r: r.max_tokens == 3),
        "stop": ({"stop": ["x"]}, lambda r: r.stop == ("x",)),
        "tools": ({"tools": [TOOL]}, None),
        "tool_choice": (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            grammar,
        ),
        "parallel_tool_calls": ({"tools": [TOOL], "parallel_tool_calls": False}, None),
        "response_format": (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                }
            },
            grammar,
        ),
        "response_format: yaml": ({"response_format": {"type": "yaml"}}, None),
        "logprobs": ({"logprobs": True}, lambda r: r.logprobs == 0),
        "top_logprobs": ({"logprobs": True, "top_logprobs": 3}, lambda r: r.logprobs == 3),
        "reasoning_effort": ({"reasoning_effort": "low"}, None),
        "chat_template_kwargs": ({"chat_template_kwargs": {"enable_thinking": False}}, None),
        "n: 1": ({"n": 1}, None),
        "n: 2": ({"n": 2}, None),
        "verbosity: medium": ({"verbosity": "medium"}, None),
        "verbosity: low": ({"verbosity": "low"}, None),
        "modalities: text": ({"modalities": ["text"]}, None),
        "modalities: audio": ({"modalities": ["text", "audio"]}, None),
        "audio": ({"audio": {"voice": "alloy", "format": "mp3"}}, None),
        "functions": ({"functions": [TOOL["function"]]}, None),
        "function_call": ({"function_call": "auto"}, None),
        "web_search_options": ({"web_search_options": {}}, None),
        "moderation": ({"moderation": {"mode": "block"}}, None),
        "metadata": ({"metadata": {"k": "v"}}, None),
        "store": ({"store": True}, None),
        "service_tier": ({"service_tier": "auto"}, None),
        "prompt_cache_key": ({"prompt_cache_key": "k"}, None),
        "prompt_cache_retention": ({"prompt_cache_retention": "24h"}, None),
        "prompt_cache_retention: 7d": ({"prompt_cache_retention": "7d"}, None),
        "prompt_cache_options": ({"prompt_cache_options": {}}, None),
        "safety_identifier": ({"safety_identifier": "s"}, None),
        "prediction": ({"prediction": {"type": "content", "content": "hi"}}, None),
    },
    "/v1/completions": {
        **COMMON,
        "omlx_cache_control": NO_STORE,
        "prompt": ({"prompt": [104, 105]}, lambda r: r.prompt_tokens == (104, 105)),
        "max_tokens": ({"max_tokens": 3}, lambda r: r.max_tokens == 3),
        "stop": ({"stop": "x"}, lambda r: r.stop == ("x",)),
        "echo": ({"echo": True}, None),
        "logprobs": ({"logprobs": 2}, lambda r: r.logprobs == 2),
        "n: 2": ({"n": 2}, None),
        "best_of: 2": ({"best_of": 2}, None),
        "suffix": ({"suffix": "end"}, None),
    },
    "/v1/responses": {
        "omlx_cache_control": NO_STORE,
        "model": ({}, None),
        "input": ({}, None),
        "instructions": ({"instructions": "be brief"}, None),
        "stream": ({"stream": True}, None),
        "store": ({"store": False}, None),
        "previous_response_id": ({"previous_response_id": "FIRST"}, None),
        "tools": ({"tools": [{"type": "function", "name": "f"}]}, None),
        "tool_choice": (
            {
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "f"},
            },
            grammar,
        ),
        "parallel_tool_calls": ({"parallel_tool_calls": False}, None),
        "max_output_tokens": ({"max_output_tokens": 3}, lambda r: r.max_tokens == 3),
        "temperature": ({"temperature": 0.3}, lambda r: r.sampling.temperature == 0.3),
        "top_p": ({"top_p": 0.5}, lambda r: r.sampling.top_p == 0.5),
        "reasoning": ({"reasoning": {"effort": "low", "summary": "auto"}}, None),
        "text": (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}},
            grammar,
        ),
        "text.format: yaml": ({"text": {"format": {"type": "yaml"}}}, None),
        "text.verbosity: low": ({"text": {"verbosity": "low"}}, None),
        "include": ({"include": ["reasoning.encrypted_content", "web_search_call.results"]}, None),
        "include: message.output_text.logprobs": (
            {"include": ["message.output_text.logprobs"]},
            None,
        ),
        "truncation: disabled": ({"truncation": "disabled"}, None),
        "truncation: auto": ({"truncation": "auto"}, None),
        "metadata": ({"metadata": {"k": "v"}}, None),
        "prompt_cache_key": ({"prompt_cache_key": "k"}, None),
        "prompt_cache_retention": ({"prompt_cache_retention": "24h"}, None),
        "prompt_cache_retention: 7d": ({"prompt_cache_retention": "7d"}, None),
        "prompt_cache_options": ({"prompt_cache_options": {}}, None),
        "client_metadata": ({"client_metadata": {"k": "v"}}, None),
        "user": ({"user": "u"}, None),
        "safety_identifier": ({"safety_identifier": "s"}, None),
        "service_tier": ({"service_tier": "auto"}, None),
        "stream_options": (
            {"stream": True, "stream_options": {"include_obfuscation": False}},
            None,
        ),
        "max_tool_calls": ({"max_tool_calls": 3}, None),
        "background": ({"background": True}, None),
        "conversation": ({"conversation": "conv_1"}, None),
        "prompt": ({"prompt": {"id": "pmpt_1"}}, None),
        "top_logprobs": ({"top_logprobs": 2}, None),
        "context_management": ({"context_management": [{"type": "compaction"}]}, None),
        "moderation": ({"moderation": {"mode": "block"}}, None),
    },
    "/v1/messages": {
        "cache_control": ({"cache_control": {"type": "ephemeral"}}, None),
        "omlx_cache_control": NO_STORE,
        "model": ({}, None),
        "messages": ({}, None),
        "max_tokens": ({"max_tokens": 3}, lambda r: r.max_tokens == 3),
        "system": ({"system": "be brief"}, None),
        "stop_sequences": ({"stop_sequences": ["x"]}, lambda r: r.stop == ("x",)),
        "stream": ({"stream": True}, None),
        "temperature": ({"temperature": 0.3}, lambda r: r.sampling.temperature == 0.3),
        "top_p": ({"top_p": 0.5}, lambda r: r.sampling.top_p == 0.5),
        "top_k": ({"top_k": 5}, lambda r: r.sampling.top_k == 5),
        "tools": ({"tools": [{"name": "f", "input_schema": {"type": "object"}}]}, None),
        "tool_choice": (
            {
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": "f"},
            },
            grammar,
        ),
        "thinking": ({"thinking": {"type": "enabled"}}, None),
        "thinking.budget_tokens": (
            {"thinking": {"type": "enabled", "budget_tokens": 4}},
            lambda r: r.reasoning_budget is not None and r.reasoning_budget.tokens == 4,
        ),
        "output_config": ({"output_config": {"effort": "low"}}, None),
        "output_config.format": (
            {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
            grammar,
        ),
        "output_config.format: xml": ({"output_config": {"format": {"type": "xml"}}}, None),
        "context_management": (
            {"context_management": {"edits": [{"type": "clear_thinking_20251015"}]}},
            None,
        ),
        "diagnostics": ({"diagnostics": {"previous_message_id": "msg_1"}}, None),
        "metadata": ({"metadata": {"user_id": "u"}}, None),
        "service_tier": ({"service_tier": "auto"}, None),
        "mcp_servers": ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, None),
        "container": ({"container": "c"}, None),
    },
}


def documented() -> list[tuple[str, str, str]]:
    """(route, parameter, status) for every row of the tables under ``## Parameters``."""
    rows, route = [], None
    section = DOC.read_text().split("## Parameters", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        if m := re.match(r"### `POST (\S+)`", line):
            route = m.group(1)
        elif route and (m := re.match(r"\| `([^`]+)` \| (honoured|accepted|refused) \|", line)):
            rows.append((route, m.group(1), m.group(2)))
    return rows


ROWS = documented()


def test_the_tables_cover_every_route_and_every_declared_field():
    assert {route for route, _, _ in ROWS} == set(BASES)
    for route, struct in STRUCTS.items():
        heads = {re.split(r"[.: ]", name)[0] for r, name, _ in ROWS if r == route}
        fields = {f.encode_name for f in msgspec.structs.fields(struct)}
        assert fields - heads == set(), f"{route}: fields without a row"


@pytest.mark.parametrize(("route", "name", "status"), ROWS, ids=[f"{r}:{n}" for r, n, _ in ROWS])
def test_each_parameter_is_treated_as_documented(route, name, status):
    assert name in SAMPLES[route], f"no sample for {route} {name!r}: add one"
    fragment, check = SAMPLES[route][name]
    engine = FakeEngine(reply("ok"))
    with TestClient(create_app(fake_container(engine))) as client:
        body = {**BASES[route], **fragment}
        if body.get("previous_response_id") == "FIRST":
            first = client.post(route, json=BASES[route]).json()
            body["previous_response_id"] = first["id"]
        engine.submitted.clear()
        r = client.post(route, json=body)
    if status == "refused":
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error.get("param", re.split(r"[: ]", name)[0]) == re.split(r"[: ]", name)[0]
        assert re.split(r"[.: ]", name)[0] in error["message"]
        assert engine.submitted == []
        return
    assert r.status_code == 200, r.text
    assert len(engine.submitted) == 1
    if check is not None:
        assert check(engine.submitted[0]), engine.submitted[0]
