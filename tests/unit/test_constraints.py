"""Which grammar a chat turn gets, and how a forced bare call is read back."""

from __future__ import annotations

import json

import pytest
from mlx_lm.tool_parsers import qwen3_coder

from omlx.app.api.openai.params import response_format_of
from omlx.app.chat.constraints import ResponseFormat, closed, output_grammar
from omlx.app.chat.output import OutputFormat
from omlx.app.chat.tool_calls import HERMES, formats, opaque_format
from omlx.app.errors import InvalidRequest

QWEN = OutputFormat(("<think>", "</think>"), HERMES)
CODER = OutputFormat(
    None, opaque_format("<tool_call>", "</tool_call>", qwen3_coder.parse_tool_call)
)
PLAIN = OutputFormat()
TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "b", "parameters": None, "strict": True}},
]


def grammar(fmt=PLAIN, **kw):
    args = dict(
        fmt=fmt,
        in_reasoning=False,
        response_format=None,
        tool_mode="auto",
        tool_name=None,
        tools=TOOLS,
        parallel=True,
    )
    return output_grammar(**{**args, **kw})


def test_a_free_turn_has_no_grammar():
    assert grammar() is None
    assert grammar(tool_mode="none") is None


def test_a_named_call_in_a_hermes_model_uses_its_markers():
    g, param = grammar(QWEN, tool_mode="function", tool_name="b", in_reasoning=True)
    assert param == "tool_choice"
    assert [c.name for c in g.calls] == ["b"]
    # No parameters: no arguments at all (closed).
    assert json.loads(g.calls[0].parameters) == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert g.calls[0].before == ("<tool_call>", "\n", '{"name": "b", "arguments": ')
    assert g.calls[0].after == ("}", "\n", "</tool_call>") and not g.several_calls
    assert g.think == ("<think>", "</think>") and g.in_reasoning
    assert g.strict  # the one tool says strict


def test_required_allows_several_calls_unless_parallel_calls_are_off():
    g, _ = grammar(QWEN, tool_mode="required")
    assert [c.name for c in g.calls] == ["a", "b"] and g.several_calls and not g.strict
    g, _ = grammar(QWEN, tool_mode="required", parallel=False)
    assert not g.several_calls


@pytest.mark.parametrize("fmt", [PLAIN, CODER])
def test_models_without_a_syntax_omlx_writes_are_forced_in_hermes(fmt):
    g, _ = grammar(fmt, tool_mode="required")
    assert g.calls[0].before == HERMES.before("a") and g.several_calls


def test_harmony_forces_the_call_without_its_analysis_channel():
    g, _ = grammar(OutputFormat(formats.HARMONY.think, formats.HARMONY), tool_mode="required")
    assert g.think is None and not g.several_calls
    assert g.calls[0].before[1] == "commentary to=functions.a "


def test_forced_arguments_are_closed_unless_the_schema_opens_them():
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "allOf": [{"properties": {"x": {}}}],
    }
    out = closed(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["where"]["additionalProperties"] is False
    assert out["properties"]["tags"]["additionalProperties"] == {"type": "string"}  # kept
    assert "additionalProperties" not in out["allOf"][0]  # each branch adds its own keys
    g, _ = grammar(
        QWEN,
        tool_mode="function",
        tool_name="a",
        tools=[{"type": "function", "function": {"name": "a", "parameters": schema}}],
    )
    assert json.loads(g.calls[0].parameters) == out


def test_a_forced_call_wins_over_a_response_format():
    g, param = grammar(
        QWEN, tool_mode="required", response_format=ResponseFormat({"type": "object"})
    )
    assert param == "tool_choice" and g.calls


def test_response_formats():
    assert response_format_of(None) is None
    assert response_format_of({"type": "text"}) is None
    assert response_format_of({"type": "json_object"}) == ResponseFormat(None)
    chat = response_format_of(
        {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": True},
        }
    )
    assert chat == ResponseFormat({"type": "integer"}, strict=True)
    assert response_format_of(
        {"type": "json_schema", "json_schema": {"name": "x"}}
    ) == ResponseFormat({})
    inline = response_format_of(
        {"type": "json_schema", "name": "x", "schema": {}}, param="text.format"
    )
    assert inline == ResponseFormat({}, strict=False, param="text.format")
    for bad in (
        {"type": "yaml"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "x"}},
    ):
        with pytest.raises(InvalidRequest) as err:
            response_format_of(bad)
        assert err.value.param == "response_format"
    g, param = grammar(response_format=ResponseFormat(None, param="output_config.format"))
    assert json.loads(g.json_schema) == {"type": "object"} and param == "output_config.format"


def test_a_schema_keeps_its_property_order():
    schema = {"type": "object", "properties": {"z": {}, "a": {}}}
    g, _ = grammar(response_format=ResponseFormat(schema))
    assert list(json.loads(g.json_schema)["properties"]) == ["z", "a"]
