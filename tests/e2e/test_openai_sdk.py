"""The official openai client, sync and async, against the scripted model: tools, thinking, limits."""

from __future__ import annotations

import asyncio
import json

import openai

from tests.e2e.conftest import API_KEY
from tests.scripted_model import ANSWER, MODEL_ID, REPLY, THOUGHT

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def aclient(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def test_tool_call_round_trip(scripted_server):
    c = client(scripted_server)
    first = c.chat.completions.create(
        model=MODEL_ID, messages=ASK, tools=[WEATHER_TOOL], tool_choice="auto", seed=7
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.content is None

    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"},
    ]
    second = c.chat.completions.create(model=MODEL_ID, messages=history, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == ANSWER
    assert second.choices[0].finish_reason == "stop"
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def test_streamed_tool_call(scripted_server):
    stream = client(scripted_server).chat.completions.create(
        model=MODEL_ID,
        messages=ASK,
        tools=[WEATHER_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    # A first chunk with the call's id and name, then its arguments as they were written.
    assert deltas[0].index == 0 and deltas[0].id and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == {"city": "Paris"}
    finishes = [
        ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]
    assert (
        chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    )  # EOS is not counted


def test_tool_choice_none_leaves_the_text(scripted_server):
    reply = client(scripted_server).chat.completions.create(
        model=MODEL_ID, messages=ASK, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content.startswith("<tool_call>")
    assert reply.choices[0].finish_reason == "stop"


def test_reasoning_is_split_out(scripted_server):
    reply = client(scripted_server).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    )
    message = reply.choices[0].message
    assert message.content == REPLY
    assert message.reasoning_content == THOUGHT


def test_stop_and_max_completion_tokens(scripted_server):
    c = client(scripted_server)
    history = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    stopped = c.chat.completions.create(model=MODEL_ID, messages=history, stop=["sunny"])
    assert stopped.choices[0].message.content == "It is "
    assert stopped.choices[0].finish_reason == "stop"
    cut = c.chat.completions.create(model=MODEL_ID, messages=ASK, max_completion_tokens=1)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 1


async def _async_round(server) -> tuple[str, str, str]:
    c = aclient(server)
    reply = await c.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "Hi"}],
    )
    stream = await c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    reasoning, content = [], []
    async for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            content.append(delta.content or "")
    await c.close()
    return reply.choices[0].message.content, "".join(reasoning), "".join(content)


def test_async_client(scripted_server):
    whole, reasoning, content = asyncio.run(_async_round(scripted_server))
    assert whole == REPLY
    assert (reasoning, content) == (THOUGHT, REPLY)
