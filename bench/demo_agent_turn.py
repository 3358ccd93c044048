"""One agent turn with a tool, through the official openai and anthropic SDKs, against omlx.

    make serve                                   # in one shell (add ARGS="--api-key KEY" to try auth)
    .venv/bin/python bench/demo_agent_turn.py [--base-url http://127.0.0.1:8000] [--api-key KEY]

Each SDK offers a ``get_weather`` tool; if the model calls it, the demo runs the tool,
sends the result back and streams the final answer. The default SmolLM2-135M has no
tool-calling template and answers in text; to watch the whole round trip on a model
that always calls the tool, serve the scripted test model:

    .venv/bin/python -c "from pathlib import Path; from tests.scripted_model import \\
        build_scripted_model as b; b(Path('/tmp/scripted'))"
    make serve ARGS="--model /tmp/scripted"
"""

from __future__ import annotations

import argparse
import json
import time

import anthropic
import httpx
import openai

QUESTION = "What is the weather in Paris right now? Use the tool."
SYSTEM = "You are a helpful assistant. Call tools when they help."
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def get_weather(city: str = "Paris", **_: object) -> str:
    return json.dumps({"city": city, "sky": "sunny", "celsius": 24})


def openai_turn(base_url: str, api_key: str, model: str) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0)
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": PARAMETERS,
        },
    }
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    start = time.monotonic()
    first = client.chat.completions.create(
        model=model, messages=messages, tools=[tool], max_tokens=200, temperature=0
    )
    message = first.choices[0].message
    print(
        f"  1st call: finish_reason={first.choices[0].finish_reason} ({time.monotonic() - start:.2f}s)"
    )
    if getattr(message, "reasoning_content", None):
        print(f"  reasoning: {message.reasoning_content!r}")
    if not message.tool_calls:
        print(f"  the model answered without the tool: {message.content!r}")
        return
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls:
        arguments = json.loads(call.function.arguments)
        result = get_weather(**arguments)
        print(f"  tool call {call.id}: {call.function.name}({arguments}) -> {result}")
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print("  2nd call, streamed: ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[tool],
        max_tokens=200,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage:
            cached = (
                chunk.usage.prompt_tokens_details.cached_tokens
                if chunk.usage.prompt_tokens_details
                else 0
            )
            print(
                f"\n  usage: prompt {chunk.usage.prompt_tokens} (cached {cached}), completion {chunk.usage.completion_tokens}"
            )


def anthropic_turn(base_url: str, api_key: str, model: str) -> None:
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0)
    tool = {
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": PARAMETERS,
    }
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    start = time.monotonic()
    first = client.messages.create(
        model=model, system=SYSTEM, messages=messages, tools=[tool], max_tokens=200, temperature=0
    )
    print(
        f"  1st call: stop_reason={first.stop_reason}, blocks={[b.type for b in first.content]} ({time.monotonic() - start:.2f}s)"
    )
    uses = [b for b in first.content if b.type == "tool_use"]
    if not uses:
        print(
            f"  the model answered without the tool: {''.join(b.text for b in first.content if b.type == 'text')!r}"
        )
        return
    results = []
    for use in uses:
        result = get_weather(**use.input)
        print(f"  tool_use {use.id}: {use.name}({use.input}) -> {result}")
        results.append({"type": "tool_result", "tool_use_id": use.id, "content": result})
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": results},
    ]
    print("  2nd call, streamed events:")
    with client.messages.stream(
        model=model, system=SYSTEM, messages=messages, tools=[tool], max_tokens=200, temperature=0
    ) as stream:
        kinds = []
        for event in stream:
            if event.type in (
                "message_start",
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ):
                kinds.append(event.type)
        final = stream.get_final_message()
    print(f"    {' -> '.join(kinds)}")
    print(f"  answer: {''.join(b.text for b in final.content if b.type == 'text')!r}")
    u = final.usage
    print(
        f"  usage: input {u.input_tokens} + cache_read {u.cache_read_input_tokens}, output {u.output_tokens}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="none", help="the server's --api-key, if it has one")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"}
    model = (
        httpx.get(args.base_url + "/v1/models", headers=headers, timeout=10)
        .raise_for_status()
        .json()["data"][0]["id"]
    )
    print(f"server {args.base_url}, model {model}")
    print("openai SDK:")
    openai_turn(args.base_url, args.api_key, model)
    print("anthropic SDK:")
    anthropic_turn(args.base_url, args.api_key, model)


if __name__ == "__main__":
    main()
