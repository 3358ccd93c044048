"""Structured outputs and forced tool calls through real servers and the official SDKs.

The default model (SmolLM2-135M, sampled at temperature 1) answers under a JSON schema and
is forced to call tools that its template does not render (omlx's fallback shows them in the
system turn and forces the call as ``<tool_call>`` JSON); the scripted model writes forced
calls in its own ``<tool_call>`` syntax.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import API_KEY
from tests.scripted_model import MODEL_ID as SCRIPTED

DEFAULT = "smollm2-135m-instruct"
# Nested objects, arrays, enums, integers, additionalProperties false; strings and
# arrays bounded so that every sample can finish within max_tokens.
PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "role", "address", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "zip"],
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "zip": {"type": "integer", "minimum": 10000, "maximum": 99999},
            },
        },
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    },
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 20}},
    "required": ["zone"],
    "additionalProperties": False,
}
# A small schema, where a test is about the route rather than the schema.
LEVEL = {
    "type": "object",
    "properties": {
        "level": {"enum": ["low", "high"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["level", "score"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def test_sampled_answers_always_match_the_schema(default_server):
    """Three seeds at once: the server decodes them as one batch, each row under its own
    grammar state (15.6 s one after another here, 9 s together)."""

    def sample(seed: int):
        return oai(default_server).chat.completions.create(
            model=DEFAULT,
            messages=[{"role": "user", "content": "Describe a user of our app."}],
            temperature=1.0,
            seed=seed,
            max_tokens=200,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
        )

    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(sample, [0, 1, 2]))
    for r in replies:
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    assert len({r.choices[0].message.content for r in replies}) > 1  # sampled, not one answer


@pytest.mark.slow
def test_json_object_is_an_object(default_server):
    r = oai(default_server).chat.completions.create(
        model=DEFAULT,
        messages=[{"role": "user", "content": "Give me a small JSON object."}],
        temperature=0,
        max_tokens=40,
        response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still an object's beginning
        assert r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize(("name", "stream"), [("get_time", False), ("get_weather", True)])
def test_openai_forced_call_names_the_tool_with_valid_arguments(default_server, name, stream):
    args = dict(
        model=DEFAULT,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": name}},
        max_tokens=80,
    )
    c = oai(default_server)
    if stream:
        chunks = list(c.chat.completions.create(**args, stream=True))
        calls = [t for ch in chunks if ch.choices for t in ch.choices[0].delta.tool_calls or []]
        finish = [
            ch.choices[0].finish_reason
            for ch in chunks
            if ch.choices and ch.choices[0].finish_reason
        ]
        assert finish == ["tool_calls"]
        # A first chunk with the id and name, then the arguments as fragments.
        assert calls[0].id and calls[0].function.name == name and len(calls) > 2
        assert {c.index for c in calls} == {0} and all(c.id is None for c in calls[1:])
        arguments = "".join(c.function.arguments or "" for c in calls)
        call = calls[0]
        call.function.arguments = arguments
    else:
        r = c.chat.completions.create(**args)
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
    assert call.function.name == name
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[name])


@pytest.mark.slow
def test_openai_required_calls_one_of_the_tools(default_server):
    r = oai(default_server).chat.completions.create(
        model=DEFAULT, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=80
    )
    (call,) = r.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize(
    ("choice", "stream"), [({"type": "tool", "name": "get_time"}, False), ({"type": "any"}, True)]
)
def test_anthropic_forced_tool_use(default_server, choice, stream):
    tools = [
        {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS
    ]
    args = dict(model=DEFAULT, max_tokens=80, messages=ASK, tools=tools, tool_choice=choice)
    c = claude(default_server)
    if stream:
        with c.messages.stream(**args) as s:
            message = s.get_final_message()
    else:
        message = c.messages.create(**args)
    assert message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    if choice["type"] == "tool":
        assert use.name == "get_time"
    jsonschema.validate(use.input, SCHEMAS[use.name])


def test_anthropic_output_format_matches_the_schema(default_server):
    message = claude(default_server).messages.create(
        model=DEFAULT,
        max_tokens=40,
        messages=[{"role": "user", "content": "Rate the risk."}],
        temperature=1.0,
        extra_body={"output_config": {"format": {"type": "json_schema", "schema": LEVEL}}},
    )
    (block,) = message.content
    jsonschema.validate(json.loads(block.text), LEVEL)


@pytest.mark.slow
def test_responses_text_format_and_forced_function(default_server):
    c = oai(default_server)
    r = c.responses.create(
        model=DEFAULT,
        input="Rate the risk.",
        max_output_tokens=40,
        text={"format": {"type": "json_schema", "name": "level", "schema": LEVEL, "strict": True}},
    )
    jsonschema.validate(json.loads(r.output_text), LEVEL)
    r = c.responses.create(
        model=DEFAULT,
        input="What time is it in Tokyo?",
        max_output_tokens=80,
        tools=[{"type": "function", "name": "get_time", "parameters": TIME}],
        tool_choice={"type": "function", "name": "get_time"},
    )
    (call,) = [i for i in r.output if i.type == "function_call"]
    assert call.name == "get_time"
    jsonschema.validate(json.loads(call.arguments), TIME)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_in_the_models_own_syntax_is_parsed_back(scripted_server, stream):
    """After a tool result the scripted model answers in prose; forced, it calls again,
    writing ``<tool_call>…</tool_call>`` that mlx-lm's parser reads."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
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
    c = oai(scripted_server)
    free = c.chat.completions.create(model=SCRIPTED, messages=messages, tools=[tool], max_tokens=64)
    assert free.choices[0].finish_reason == "stop"  # unforced, it answers
    args = dict(
        model=SCRIPTED,
        messages=messages,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
    )
    if stream:
        chunks = list(c.chat.completions.create(**args, stream=True))
        deltas = [t for ch in chunks if ch.choices for t in ch.choices[0].delta.tool_calls or []]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        calls = [d for d in deltas if d.id]  # the first chunk of each call
        for call in calls:
            call.function.arguments = "".join(
                d.function.arguments or "" for d in deltas if d.index == call.index
            )
    else:
        r = c.chat.completions.create(**args)
        calls, text = r.choices[0].message.tool_calls, r.choices[0].message.content or ""
    (call,) = calls
    assert call.function.name == "get_weather" and "<tool_call>" not in text
    assert "city" in json.loads(call.function.arguments)


def test_grammar_compile_time_is_a_phase_in_metrics(default_server):
    oai(default_server).chat.completions.create(
        model=DEFAULT, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=4
    )
    metrics = httpx.get(default_server.base_url + "/metrics").text
    counts = [
        line
        for line in metrics.splitlines()
        if line.startswith('omlx_request_phase_seconds_count{phase="grammar"}')
    ]
    assert counts and float(counts[0].split()[-1]) >= 1
