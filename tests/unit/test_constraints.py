"""Which grammar a chat turn gets, and how a forced bare call is read back."""

from __future__ import annotations

import json

import pytest
from mlx_lm.tool_parsers import json_tools, qwen3_coder

from omlx.app.api.openai.params import response_format_of
from omlx.app.constraints import ResponseFormat, output_grammar
from omlx.app.errors import InvalidRequest
from omlx.app.output import Content, OutputFormat, OutputSplitter, Reasoning, ToolCallPiece

QWEN = OutputFormat(
    ("<think>", "</think>"), ("<tool_call>", "</tool_call>"), json_tools.parse_tool_call
)
CODER = OutputFormat(None, ("<tool_call>", "</tool_call>"), qwen3_coder.parse_tool_call)
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


def test_a_named_call_in_a_json_tools_model_uses_its_markers():
    g, param = grammar(QWEN, tool_mode="function", tool_name="b", in_reasoning=True)
    assert param == "tool_choice"
    assert [t.name for t in g.tools] == ["b"] and json.loads(g.tools[0].parameters) == {
        "type": "object"
    }
    assert g.call_markers == ("<tool_call>", "</tool_call>") and not g.several_calls
    assert g.think == ("<think>", "</think>") and g.in_reasoning
    assert g.strict  # the one tool says strict


def test_required_allows_several_calls_unless_parallel_calls_are_off():
    g, _ = grammar(QWEN, tool_mode="required")
    assert [t.name for t in g.tools] == ["a", "b"] and g.several_calls and not g.strict
    g, _ = grammar(QWEN, tool_mode="required", parallel=False)
    assert not g.several_calls


@pytest.mark.parametrize("fmt", [PLAIN, CODER])
def test_models_without_json_call_markers_get_a_bare_call(fmt):
    g, _ = grammar(fmt, tool_mode="required")
    assert g.call_markers is None and not g.several_calls


def test_a_forced_call_wins_over_a_response_format():
    g, param = grammar(
        QWEN, tool_mode="required", response_format=ResponseFormat({"type": "object"})
    )
    assert param == "tool_choice" and g.tools


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


def test_a_bare_call_is_read_back_after_reasoning():
    splitter = OutputSplitter(QWEN, tools=TOOLS, bare_call=True, in_reasoning=True)
    pieces = []
    for part in ["hm", "m</think>\n", '{"name": "a", ', '"arguments": {"x": 1}}']:
        pieces += splitter.feed(part)
    pieces += splitter.finish()
    assert pieces == [Reasoning("hm"), Reasoning("m"), ToolCallPiece("a", '{"x": 1}')]
    assert splitter.tool_calls == 1


def test_a_bare_call_cut_short_is_text():
    splitter = OutputSplitter(PLAIN, tools=TOOLS, bare_call=True)
    assert splitter.feed('{"name": "a", "argu') == []
    assert splitter.finish() == [Content('{"name": "a", "argu')]
