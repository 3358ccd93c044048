"""The official anthropic client, sync and async, against the scripted model."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx

from tests.e2e.conftest import API_KEY
from tests.scripted_model import ANSWER, MODEL_ID, REPLY, THOUGHT

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "cache_control": {"type": "ephemeral"},
}
SYSTEM = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
ASK = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Weather in Paris?", "cache_control": {"type": "ephemeral"}}
        ],
    }
]


def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def test_tool_use_round_trip(scripted_server):
    c = client(scripted_server)
    first = c.messages.create(
        model=MODEL_ID, max_tokens=64, system=SYSTEM, messages=ASK, tools=[WEATHER_TOOL]
    )
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert (
        use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    )
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": [{"type": "text", "text": "sunny"}],
                }
            ],
        },
    ]
    second = c.messages.create(
        model=MODEL_ID, max_tokens=64, system=SYSTEM, messages=history, tools=[WEATHER_TOOL]
    )
    assert [b.type for b in second.content] == ["text"]
    assert second.content[0].text == ANSWER
    assert second.stop_reason == "end_turn"


def test_usage_counts_cache_reads_once(scripted_server):
    c = client(scripted_server)
    ask = [
        {
            "role": "user",
            "content": "A question long enough to fill a cache block or two of sixteen tokens.",
        }
    ]
    first = c.messages.create(
        model=MODEL_ID, max_tokens=64, system="usage test", messages=ask, tools=[WEATHER_TOOL]
    )
    again = c.messages.create(
        model=MODEL_ID, max_tokens=64, system="usage test", messages=ask, tools=[WEATHER_TOOL]
    )

    def whole(usage) -> int:  # Anthropic: input + cache writes + cache reads = the prompt
        return (
            usage.input_tokens
            + (usage.cache_creation_input_tokens or 0)
            + (usage.cache_read_input_tokens or 0)
        )

    prompt = whole(first.usage)
    # The tool's cache_control breakpoint: the first turn wrote the tools' tokens.
    assert first.usage.cache_creation_input_tokens > 0
    assert again.usage.cache_read_input_tokens > 0
    assert whole(again.usage) == prompt
    counted = c.messages.count_tokens(
        model=MODEL_ID, system="usage test", messages=ask, tools=[WEATHER_TOOL]
    )
    assert counted.input_tokens == prompt


def test_stream_events_in_order(scripted_server):
    with client(scripted_server).messages.create(
        model=MODEL_ID, max_tokens=64, messages=[{"role": "user", "content": "Hi"}], stream=True
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]  # the SDK drops ping events; test_raw_stream sees them
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    blocks = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert blocks == ["thinking", "text"]
    # every block: start, deltas, stop, with indices in order
    opened: int | None = None
    for e in events[1:-2]:
        if e.type == "content_block_start":
            assert opened is None
            opened = e.index
        elif e.type == "content_block_delta":
            assert e.index == opened
        else:
            assert e.type == "content_block_stop" and e.index == opened
            opened = None
    thinking = "".join(
        e.delta.thinking
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "thinking_delta"
    )
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert (thinking, text) == (THOUGHT, REPLY)
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens == 4


def test_streamed_tool_use_and_stop_sequence(scripted_server):
    c = client(scripted_server)
    with c.messages.stream(
        model=MODEL_ID,
        max_tokens=64,
        messages=ASK,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "any"},
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.type, b.input) for b in final.content] == [("tool_use", {"city": "Paris"})]
    cut = c.messages.create(
        model=MODEL_ID, max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
        },
    ]
    stopped = c.messages.create(
        model=MODEL_ID,
        max_tokens=64,
        messages=history,
        tools=[WEATHER_TOOL],
        stop_sequences=["sunny"],
    )
    assert stopped.content[0].text == "It is "
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == "sunny"


async def _async_turn(server) -> tuple[anthropic.types.Message, anthropic.types.Message]:
    c = anthropic.AsyncAnthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    whole = await c.messages.create(
        model=MODEL_ID,
        max_tokens=64,
        messages=[{"role": "user", "content": "Hi"}],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    async with c.messages.stream(
        model=MODEL_ID, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        streamed = await stream.get_final_message()
    await c.close()
    return whole, streamed


def test_async_client_gets_thinking_blocks(scripted_server):
    whole, streamed = asyncio.run(_async_turn(scripted_server))
    for message in (whole, streamed):
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == THOUGHT and message.content[1].text == REPLY


def test_raw_stream_names_each_event_and_pings(scripted_server):
    body = {
        "model": MODEL_ID,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
    }
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    with httpx.stream(
        "POST", scripted_server.base_url + "/v1/messages", json=body, headers=headers, timeout=60
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    datas = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in datas]
    blocks = ["content_block_start", "content_block_delta", "content_block_stop"]
    # a thinking block ends with its signature, as Anthropic's own stream does
    thinking = [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
    ]
    assert names == ["message_start", "ping", *thinking, *blocks, "message_delta", "message_stop"]
    assert datas[4]["delta"]["type"] == "signature_delta" and datas[4]["delta"]["signature"]
