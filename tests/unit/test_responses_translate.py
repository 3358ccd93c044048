"""Responses API over the fake engine: every input item kind reaches the template as it
should, what omlx cannot honour is a 400 naming it, and turn n+1's prompt starts with
turn n's prompt and output."""

from __future__ import annotations

import json
import logging

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.api.responses.items import ItemRenderer
from omlx.app.api.responses.schemas import ReasoningParam, ResponsesRequest
from omlx.app.api.responses.translate import Translator, tools_to_template
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.sealing import ReasoningSeal
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container, reply

TOOL = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
F_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": False}


def serve(engine: FakeEngine, **settings) -> tuple[TestClient, object]:
    container = fake_container(engine, **settings)
    return TestClient(create_app(container)), container


def prompt_of(engine: FakeEngine, i: int = -1) -> str:
    return bytes(engine.submitted[i].prompt_tokens).decode()


def text(value: str) -> dict:
    return {"type": "input_text", "text": value}


def test_string_input_with_instructions():
    engine = FakeEngine(reply("ok"))
    client, _ = serve(engine)
    with client as c:
        r = c.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "instructions": "be brief"}
        )
    assert r.status_code == 200, r.text
    assert prompt_of(engine).splitlines() == ["<system>be brief", "<user>hi", "<assistant>"]


def test_every_item_kind_becomes_template_messages():
    engine = FakeEngine(reply("done"))
    client, container = serve(engine)
    sealed = container.seal.seal("exact thought")
    items = [
        {"type": "message", "role": "developer", "content": [text("rules "), text("apply")]},
        {"role": "system", "content": "more rules"},
        {"type": "message", "role": "user", "content": [text("wea"), text("ther?")]},
        # One assistant turn: reasoning (sealed text wins over what it shows), text, two calls.
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "a summary"}],
            "encrypted_content": sealed,
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "checking", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [text("rain")]},
        {"role": "user", "content": "and tomorrow?"},
        {"role": "assistant", "content": "plain string reply"},
        {"role": "user", "content": [{"type": "output_text", "text": "odd but text"}]},
    ]
    with client as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": items, "tools": [F_TOOL]})
    assert r.status_code == 200, r.text
    assert prompt_of(engine).splitlines() == [
        "<tools>f",
        "<system>rules apply",
        "<system>more rules",
        "<user>weather?",
        "<assistant><think>exact thought</think>checking"
        '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "f", "arguments": "not json"}</tool_call>',
        "<tool>sunny",
        "<tool>rain",
        "<user>and tomorrow?",
        "<assistant>plain string reply",
        "<user>odd but text",
        "<assistant>",
    ]


def test_reasoning_without_a_seal_of_ours(caplog):
    renderer = ItemRenderer(PromptNormalizer(), ReasoningSeal(b"k" * 32))
    foreign = {
        "type": "reasoning",
        "id": "rs_x",
        "summary": [{"type": "summary_text", "text": "summed up"}],
        "encrypted_content": "gAAAAB-someone-elses",
    }
    shown = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "t"}],
    }
    with caplog.at_level(logging.INFO, logger="omlx.app.api.responses.items"):
        assert renderer.reasoning_text(foreign) == "summed up"
        assert renderer.reasoning_text({**foreign, "summary": []}) == ""
        assert renderer.reasoning_text(shown) == "t"
    assert sum("rs_x" in r.message and "dropped" in r.message for r in caplog.records) == 2
    messages, labels = renderer.messages(
        [
            {"type": "message", "role": "user", "content": [text("q")]},
            {**foreign, "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            },
        ]
    )
    assert messages[1] == {"role": "assistant", "content": "a"}  # no reasoning left to render
    assert labels == ["input[0]", "input[1]"]


def test_hosted_tools_are_left_out_and_logged(caplog):
    tools = [
        F_TOOL,
        {"type": "namespace", "name": "agents", "description": "d", "tools": [F_TOOL]},
        {"type": "web_search", "external_web_access": False},
    ]
    # (before an app is made: its logging setup replaces the capturing handler)
    with caplog.at_level(logging.DEBUG, logger="omlx.app.api.responses.translate"):
        assert tools_to_template(tools[1:]) is None
    (line,) = [r.message for r in caplog.records if "left out" in r.message]
    assert "agents (namespace)" in line and "web_search" in line
    engine = FakeEngine(reply("ok"))
    client, _ = serve(engine)
    with client as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": tools})
    assert r.status_code == 200, r.text
    assert prompt_of(engine).splitlines()[0] == "<tools>f"
    assert r.json()["tools"] == tools  # echoed as sent


REFUSED = [
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"context_management": [{"type": "compaction"}]}, "context_management"),
    ({"moderation": {"model": "m"}}, "moderation"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format"),
    # a schema the grammar compiler cannot enforce (the fake refuses on "refuse")
    (
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"refuse": 1}}}},
        "text.format",
    ),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools to require
    ({"reasoning": {"effort": "enormous"}}, "reasoning.effort"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": []}, "input"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0]",  # not a data URL nor http(s)
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
        "input[0].content[0].file_id",
    ),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input[0]"),
    (
        {
            "input": [
                {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}
            ]
        },
        "input[0]",
    ),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0]"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
    ({"input": [{"type": "message", "role": "critic", "content": "x"}]}, "input[0]"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
]


@pytest.mark.parametrize(("extra", "param"), REFUSED, ids=[p for _, p in REFUSED])
def test_what_omlx_cannot_honour_is_a_400_naming_it(extra, param):
    engine = FakeEngine(reply("ok"))
    client, _ = serve(engine)
    with client as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": "hi", **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param.split(".")[0].split("[")[0] in error["message"] or "input" in error["message"]
    assert engine.submitted == []


def test_fields_that_change_nothing_are_accepted():
    engine = FakeEngine(reply("ok"))
    client, _ = serve(engine)
    body = {
        "model": MODEL,
        "input": "hi",
        "store": False,
        "prompt_cache_key": "k",
        "prompt_cache_retention": "24h",
        "client_metadata": {"x-client": "1"},
        "metadata": {"a": "b"},
        "user": "u",
        "safety_identifier": "s",
        "service_tier": "auto",
        "stream_options": {"include_obfuscation": False},
        "include": ["reasoning.encrypted_content", "web_search_call.action.sources"],
        "reasoning": {"summary": "auto"},
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "truncation": "disabled",
        "max_tool_calls": 3,
        "top_logprobs": 0,
        "background": False,
        "an_unknown_field": 1,
    }
    with client as c:
        r = c.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == {"a": "b"} and r.json()["store"] is False


def test_sampling_and_effort_reach_the_request():
    engine = FakeEngine(reply("ok"))
    client, _ = serve(engine)
    with client as c:
        body = {
            "model": MODEL,
            "input": "hi",
            "max_output_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
        }
        assert c.post("/v1/responses", json=body).status_code == 200
    request = engine.submitted[0]
    assert (request.max_tokens, request.sampling.temperature, request.sampling.top_p) == (
        7,
        0.5,
        0.9,
    )
    translator = Translator(PromptNormalizer(), ReasoningSeal(b"k" * 32), effort_kwarg=True)
    for effort, kwargs in [
        ("xhigh", {"reasoning_effort": "high"}),
        ("none", {"enable_thinking": False, "reasoning_effort": "low"}),
    ]:
        data = ResponsesRequest(model=MODEL, input="hi", reasoning=ReasoningParam(effort=effort))
        assert translator.translate(data, MODEL).chat.template_kwargs == kwargs
    assert Translator(PromptNormalizer(), ReasoningSeal(b"k" * 32)).translate(
        data, MODEL
    ).chat.template_kwargs == {"enable_thinking": False}  # no reasoning_effort in the template


def test_billing_style_normalizations_apply_to_instructions_and_developer_text():
    engine = FakeEngine(reply("ok"))
    client, _ = serve(engine)
    volatile = "x-anthropic-billing-header: cch=1;\nkeep this"
    with client as c:
        body = {
            "model": MODEL,
            "instructions": volatile,
            "input": [{"role": "developer", "content": volatile}],
        }
        assert c.post("/v1/responses", json=body).status_code == 200
    assert prompt_of(engine).splitlines()[:2] == ["<system>keep this", "<system>keep this"]


def _turns(c: TestClient, engine: FakeEngine, use_previous: bool) -> tuple[str, str]:
    first_input = [{"role": "user", "content": "weather?"}]
    body = {"model": MODEL, "instructions": "sys", "input": first_input, "tools": [F_TOOL]}
    body["include"] = ["reasoning.encrypted_content"]
    first = c.post("/v1/responses", json=body).json()
    output = first["output"]
    call = next(i for i in output if i["type"] == "function_call")
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    if use_previous:
        body = {**body, "input": [result], "previous_response_id": first["id"]}
    else:
        body = {**body, "input": [*first_input, *output, result], "store": False}
    assert c.post("/v1/responses", json=body).status_code == 200
    return prompt_of(engine, -2), prompt_of(engine, -1)


@pytest.mark.parametrize("use_previous", [False, True], ids=["items", "previous_response_id"])
def test_turn_two_starts_with_turn_one_prompt_and_output(use_previous):
    produced = ["<think>mm</think>", "Let me check. ", TOOL]
    engine = FakeEngine(reply(*produced))
    client, _ = serve(engine)
    with client as c:
        one, two = _turns(c, engine, use_previous)
    assert two.startswith(one + "".join(produced)), (one, two)
    assert two.endswith("<tool>sunny\n<assistant>")


def test_parallel_tool_calls_off_keeps_the_first_and_none_keeps_markup():
    engine = FakeEngine(reply(TOOL, TOOL))
    client, _ = serve(engine)
    with client as c:
        base = {"model": MODEL, "input": "go", "tools": [F_TOOL]}
        single = c.post("/v1/responses", json={**base, "parallel_tool_calls": False}).json()
        both = c.post("/v1/responses", json=base).json()
        none = c.post("/v1/responses", json={**base, "tool_choice": "none"}).json()
        named = c.post(
            "/v1/responses", json={**base, "tool_choice": {"type": "function", "name": "f"}}
        )
    assert [i["type"] for i in single["output"]] == ["function_call"]
    assert [i["type"] for i in both["output"]] == ["function_call", "function_call"]
    assert json.loads(both["output"][0]["arguments"]) == {"a": 1}
    assert both["output"][0]["call_id"] != both["output"][1]["call_id"]
    assert [i["type"] for i in none["output"]] == ["message"]
    assert none["output"][0]["content"][0]["text"] == TOOL + TOOL
    assert named.status_code == 200


def test_cache_misses_name_the_part_that_changed():
    engine = FakeEngine(reply("ok"))
    client, _ = serve(engine)
    long = "a request long enough to share a block of prompt with the next one. " * 2
    first_input = [
        {"role": "user", "content": long},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "first"},
    ]
    with client as c:
        first = c.post(
            "/v1/responses", json={"model": MODEL, "instructions": "sys", "input": first_input}
        )
        # Named by previous_response_id, with other instructions: the system part changed.
        body = {"model": MODEL, "instructions": "other", "input": "next"}
        c.post("/v1/responses", json={**body, "previous_response_id": first.json()["id"]})
        # Found by prefix: the history resent with its second item edited.
        edited = [
            first_input[0],
            {"role": "assistant", "content": "edited"},
            {"role": "user", "content": "q"},
        ]
        c.post("/v1/responses", json={"model": MODEL, "instructions": "sys", "input": edited})
        metrics = c.get("/metrics").text
    assert 'omlx_cache_misses_total{part="system"} 1.0' in metrics
    assert 'omlx_cache_misses_total{part="input"} 1.0' in metrics


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "text"},
        {"type": "json_object"},
        {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True},
    ],
)
def test_text_format_is_echoed_and_json_ones_constrain(fmt):
    engine = FakeEngine(reply("{}"))
    client, _ = serve(engine)
    with client as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": "hi", "text": {"format": fmt}})
    assert r.status_code == 200, r.text
    assert r.json()["text"]["format"] == fmt
    assert (engine.submitted[0].constraint is None) == (fmt["type"] == "text")
