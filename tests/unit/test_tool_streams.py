"""Tool calls on all three APIs over the fake engine: arguments streamed as fragments, a
call cut by max_tokens still a call, and the fallback for a template without tools."""

from __future__ import annotations

import json
from typing import Any

from litestar.testing import TestClient
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from omlx.app.api.app import create_app
from omlx.app.chat.tool_calls import HERMES
from omlx.app.settings import Settings
from omlx.app.wiring.bootstrap import bootstrap
from tests.fakes import FakeGrammarCompiler
from tests.openai_schema_check import problems
from tests.unit.api_fakes import (
    MODEL,
    TEST_CLIENT_HOST,
    FakeEngine,
    FakeModel,
    FakeTokenizer,
    reply,
)
from tests.unit.test_api_streams import sse

HI = [{"role": "user", "content": "weather?"}]
PARAMS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}
OPENAI_TOOL = {"type": "function", "function": {"name": "f", "parameters": PARAMS}}
# A Hermes call in pieces, as tokens bring it.
CALL = [
    "<tool_call>",
    '\n{"name": "f", "arguments": ',
    '{"a": ',
    "1, ",
    '"b": "x"',
    "}}",
    "\n</tool_call>",
]
CUT = CALL[:4]  # max_tokens inside the arguments


class HermesTokenizer(FakeTokenizer):
    chat_template = "... <tool_call> ..."  # read as the Hermes family


class ToollessTokenizer(FakeTokenizer):
    """A template that renders no tools (like the default SmolLM2's)."""

    has_tool_calling = False

    def apply_chat_template(self, messages: list[dict], tools: Any = None, **kw: Any) -> str:
        return super().apply_chat_template(messages, **kw)


def serve(engine: FakeEngine, tokenizer: FakeTokenizer | None = None) -> tuple[TestClient, Any]:
    grammars = FakeGrammarCompiler()
    model = FakeModel(tokenizer=tokenizer or HermesTokenizer())
    container = bootstrap(
        Settings(max_queued_requests=4, default_max_tokens=16, allowed_hosts=(TEST_CLIENT_HOST,)),
        model=model,
        engine=engine,
        grammars=grammars,
    )
    return TestClient(create_app(container)), grammars


def test_openai_streams_a_first_chunk_with_id_and_name_then_argument_deltas():
    client, _ = serve(FakeEngine(reply(*CALL)))
    body = {"model": MODEL, "messages": HI, "tools": [OPENAI_TOOL], "stream": True}
    with client as c:
        chunks = [
            json.loads(d) for _, d in sse(c.post("/v1/chat/completions", json=body).text)[:-1]
        ]
    for chunk in chunks:
        assert problems("CreateChatCompletionStreamResponse", chunk) == []
    calls = [tc for ch in chunks for tc in ch["choices"][0]["delta"].get("tool_calls", [])]
    first, *rest = calls
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "f", "arguments": ""}
    assert [tc["function"]["arguments"] for tc in rest] == ['{"a": ', "1, ", '"b": "x"', "}"]
    assert all("id" not in tc and tc["index"] == 0 for tc in rest)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_anthropic_streams_input_json_deltas():
    client, _ = serve(FakeEngine(reply(*CALL)))
    tools = [{"name": "f", "input_schema": PARAMS}]
    body = {"model": MODEL, "messages": HI, "max_tokens": 16, "tools": tools, "stream": True}
    with client as c:
        events = [(n, json.loads(d)) for n, d in sse(c.post("/v1/messages", json=body).text)]
    names = [n for n, _ in events]
    start = names.index("content_block_start")
    assert events[start][1]["content_block"]["type"] == "tool_use"
    assert events[start][1]["content_block"]["name"] == "f"
    deltas = [e["delta"]["partial_json"] for n, e in events if n == "content_block_delta"]
    assert deltas == ['{"a": ', "1, ", '"b": "x"', "}"]
    assert names.count("content_block_stop") == 1
    assert names.index("content_block_stop") > max(
        i for i, n in enumerate(names) if n == "content_block_delta"
    )
    delta = next(e for n, e in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_responses_streams_function_call_argument_deltas():
    client, _ = serve(FakeEngine(reply(*CALL)))
    tools = [{"type": "function", "name": "f", "parameters": PARAMS}]
    body = {"model": MODEL, "input": "weather?", "tools": tools, "stream": True}
    with client as c:
        events = [json.loads(d) for _, d in sse(c.post("/v1/responses", json=body).text)]
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    kinds = [e["type"] for e in events]
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["name"] == "f"
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"a": ', "1, ", '"b": "x"', "}"]
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert (
        done["item"]["status"] == "completed" and done["item"]["arguments"] == '{"a": 1, "b": "x"}'
    )
    assert kinds.index("response.output_item.added") < kinds.index(
        "response.function_call_arguments.delta"
    )


def test_a_call_cut_by_max_tokens_is_a_call_on_every_api():
    client, _ = serve(FakeEngine(reply(*CUT, reason="length")))
    with client as c:
        chat = c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": HI, "tools": [OPENAI_TOOL]}
        ).json()
        message = c.post(
            "/v1/messages",
            json={
                "model": MODEL,
                "messages": HI,
                "max_tokens": 4,
                "tools": [{"name": "f", "input_schema": PARAMS}],
            },
        ).json()
        response = c.post(
            "/v1/responses",
            json={
                "model": MODEL,
                "input": "weather?",
                "tools": [{"type": "function", "name": "f", "parameters": PARAMS}],
            },
        ).json()
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": '{"a": 1, '}
    assert message["stop_reason"] == "max_tokens"
    assert message["content"] == [
        {"type": "tool_use", "id": message["content"][0]["id"], "name": "f", "input": {"a": 1}}
    ]
    Response.model_validate(response)
    assert response["status"] == "incomplete"
    (item,) = response["output"]
    assert item["type"] == "function_call" and item["status"] == "incomplete"
    assert item["arguments"] == '{"a": 1, '


def test_a_template_without_tools_gets_the_fallback_and_a_hermes_forced_call():
    engine = FakeEngine(reply(*CALL))
    client, grammars = serve(engine, ToollessTokenizer())
    body = {"model": MODEL, "messages": HI, "tools": [OPENAI_TOOL], "tool_choice": "required"}
    with client as c:
        plain = c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI}).json()
        forced = c.post("/v1/chat/completions", json=body).json()
    prompt = bytes(engine.submitted[-1].prompt_tokens).decode()
    assert prompt.startswith("<system># Tools") and '"name": "f"' in prompt
    assert forced["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 100
    (grammar,) = grammars.grammars
    assert grammar.calls[0].before == HERMES.before("f") and not grammar.several_calls
    assert json.loads(grammar.calls[0].parameters)["additionalProperties"] is False
    (call,) = forced["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": "x"}
    assert engine.submitted[-1].grammar_seconds > 0


def test_parallel_tool_calls_true_lets_a_forced_call_be_several():
    client, grammars = serve(FakeEngine(reply(*CALL)))
    body = {
        "model": MODEL,
        "messages": HI,
        "tools": [OPENAI_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": True,
    }
    with client as c:
        c.post("/v1/chat/completions", json=body)
    assert grammars.grammars[-1].several_calls
