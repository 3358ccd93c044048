"""The Responses API through the official openai client against real servers: create and
stream (sync and async), function-call round trips, previous_response_id, stored responses,
a request shaped like Codex's, and every raw event checked against the SDK's own types."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.e2e.conftest import API_KEY
from tests.scripted_model import ANSWER, MODEL_ID, REPLY, THOUGHT

EVENT = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": False,
}
ASK = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}]


def client(server, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def raw_events(server, body: dict, key: str = API_KEY) -> list[dict]:
    """POST a streaming request; each SSE data line validated as the SDK's event type."""
    events = []
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", server.base_url + "/v1/responses", json=body, headers=headers, timeout=120
    ) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == name
                EVENT.validate_python(event)  # a malformed event raises here
                events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    Response.model_validate(events[-1]["response"])
    return events


def test_create_returns_reasoning_and_text(scripted_server):
    raw = client(scripted_server).responses.with_raw_response.create(model=MODEL_ID, input="Hi")
    response = Response.model_validate(raw.http_response.json())  # strict, not the SDK's lax parse
    assert response.status == "completed" and response.output_text == REPLY
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert reasoning.encrypted_content is None  # not asked for
    assert message.type == "message" and message.status == "completed"
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0


def test_stream_helper_and_raw_events(scripted_server):
    with client(scripted_server).responses.stream(
        model=MODEL_ID, input="Hi", include=["reasoning.encrypted_content"]
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == REPLY == final.output_text
    assert final.output[0].encrypted_content.startswith("omlx1.")
    events = raw_events(scripted_server, {"model": MODEL_ID, "input": "Hi", "stream": True})
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.output_text.done" in kinds
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= 0 and usage["total_tokens"] > 0


def test_function_call_round_trip_by_items_and_by_previous_response_id(scripted_server):
    c = client(scripted_server)
    first = c.responses.create(model=MODEL_ID, input=ASK, tools=[WEATHER], store=False)
    (call,) = [i for i in first.output if i.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.status == "completed"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}
    history = [*ASK, *(i.model_dump(exclude_none=True) for i in first.output), result]
    second = c.responses.create(model=MODEL_ID, input=history, tools=[WEATHER], store=False)
    assert second.output_text == ANSWER
    assert second.usage.input_tokens > first.usage.input_tokens

    stored = c.responses.create(model=MODEL_ID, input=ASK, tools=[WEATHER])
    (call,) = [i for i in stored.output if i.type == "function_call"]
    follow = c.responses.create(
        model=MODEL_ID,
        previous_response_id=stored.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
    )
    assert follow.output_text == ANSWER and follow.previous_response_id == stored.id
    with pytest.raises(openai.BadRequestError) as refused:
        c.responses.create(model=MODEL_ID, input="x", previous_response_id=first.id)  # store false
    assert refused.value.body["code"] == "previous_response_not_found"


def test_retrieve_list_input_items_and_delete(scripted_server):
    c = client(scripted_server)
    first = c.responses.create(model=MODEL_ID, input="Hi", instructions="Be kind.")
    second = c.responses.create(model=MODEL_ID, input="Again", previous_response_id=first.id)
    assert c.responses.retrieve(first.id).model_dump() == first.model_dump()
    items = list(c.responses.input_items.list(second.id, order="asc"))
    assert [i.type for i in items] == ["message", "reasoning", "message", "message"]
    assert items[1].id == first.output[0].id and items[-1].content[0].text == "Again"
    page = c.responses.input_items.list(second.id, limit=1)
    assert page.has_more and len(page.data) == 1 and page.data[0].id == items[-1].id
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.AuthenticationError):
        client(scripted_server, "wrong").responses.retrieve(second.id)


async def _async_round(server) -> tuple[str, str, str]:
    c = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    whole = await c.responses.create(model=MODEL_ID, input="Hi")
    reasoning, text = [], []
    async with c.responses.stream(model=MODEL_ID, input="Hi") as stream:
        async for event in stream:
            if event.type == "response.reasoning_text.delta":
                reasoning.append(event.delta)
            elif event.type == "response.output_text.delta":
                text.append(event.delta)
        final = await stream.get_final_response()
    await c.close()
    assert final.status == "completed"
    return whole.output_text, "".join(reasoning), "".join(text)


def test_async_client(scripted_server):
    assert asyncio.run(_async_round(scripted_server)) == (REPLY, THOUGHT, REPLY)


def _codex_shaped(history: list[dict]) -> dict:
    """A request with the shape of Codex's (item kinds, tool types, flags), our own text."""
    instructions = "You are a coding agent in a terminal. Keep answers short. " * 40
    return {
        "model": MODEL_ID,
        "stream": True,
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": instructions}]},
            {
                "type": "message",
                "role": "developer",
                "content": [
                    {"type": "input_text", "text": "<sandbox>read-only</sandbox>"},
                    {"type": "input_text", "text": "<mode>default</mode>"},
                ],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env>cwd=/tmp</env>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            *history,
        ],
        "tools": [
            {**WEATHER, "strict": False},
            {"type": "function", "name": "run", "description": "Run a command", "strict": False,
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
            {"type": "namespace", "name": "helpers", "description": "Sub-agents",
             "tools": [{"type": "function", "name": "spawn", "description": "Start one", "strict": False,
                        "parameters": {"type": "object", "properties": {}}}]},
            {"type": "web_search", "external_web_access": False},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session-0001",
        "client_metadata": {"x-client-window-id": "session-0001:0", "turn_id": "t1"},
    }  # fmt: skip


def test_a_request_shaped_like_codex(scripted_server):
    events = raw_events(scripted_server, _codex_shaped([]))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and final["store"] is False
    (call,) = [i for i in final["output"] if i["type"] == "function_call"]
    # Codex's next turn: the whole history as items, no previous_response_id.
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    events = raw_events(scripted_server, _codex_shaped([*final["output"], result]))
    answer = events[-1]["response"]
    assert [i["type"] for i in answer["output"]] == ["message"]
    assert answer["output"][0]["content"][0]["text"] == ANSWER
    usage = answer["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] > final["usage"]["input_tokens"] // 2


def test_turn_two_reuses_turn_one_prompt_and_output(tiny_server):
    """Prefix stability: turn 2's cached tokens cover all of turn 1's prompt."""
    c = openai.OpenAI(base_url=tiny_server.base_url + "/v1", api_key="x", max_retries=0)
    instructions = "You are an agent working on a repository. " * 12
    ask = [{"role": "user", "content": "List the files."}]
    options = {"model": "tiny-llama", "instructions": instructions, "max_output_tokens": 8}
    first = c.responses.create(input=ask, temperature=0, **options)
    history = [*ask, *(i.model_dump(exclude_none=True) for i in first.output)]
    second = c.responses.create(
        input=[*history, {"role": "user", "content": "Open the first one."}],
        store=False,
        temperature=0,
        **options,
    )
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    third = c.responses.create(
        input="And the second?", previous_response_id=first.id, temperature=0, **options
    )
    assert third.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_a_server_with_an_ssd_tier_stores_responses_in_its_index(tiny_server):
    """In index.db, so they outlive a restart (the store itself: tests/integration)."""
    c = openai.OpenAI(base_url=tiny_server.base_url + "/v1", api_key="x", max_retries=0)
    kept = c.responses.create(model="tiny-llama", input="Hi", max_output_tokens=2)
    unkept = c.responses.create(model="tiny-llama", input="Hi", max_output_tokens=2, store=False)
    with sqlite3.connect(f"file:{tiny_server.cache_dir / 'index.db'}?mode=ro", uri=True) as db:
        rows = dict(
            db.execute(
                "SELECT id, response FROM responses WHERE id IN (?, ?)", (kept.id, unkept.id)
            )
        )
    assert list(rows) == [kept.id]
    assert Response.model_validate_json(rows[kept.id]).model_dump() == kept.model_dump()
