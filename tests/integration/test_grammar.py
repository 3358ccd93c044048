"""Output grammars compiled by llguidance for a real tokenizer, walked token by token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from omlx.adapters.grammar import LLGuidanceCompiler
from omlx.app.chat.constraints import closed
from omlx.app.chat.output import OutputFormat, OutputSplitter, collect
from omlx.app.chat.tool_calls import HERMES, formats
from omlx.domain.grammar import CallShape, GrammarError, OutputGrammar

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}},
    },
    "required": ["n", "tags"],
    "additionalProperties": False,
}
CITY = json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return LLGuidanceCompiler(tokenizer, sorted(tokenizer.eos_token_ids))


def accepts(grammars, tokenizer, grammar: OutputGrammar, text: str) -> bool:
    """Whether ``text`` (then end-of-sequence) is allowed, checking each step's mask."""
    constraint = grammars.constraint(grammar)
    words = np.zeros((constraint.vocab_size + 31) // 32, dtype=np.int32)
    tokens = [*tokenizer.encode(text, add_special_tokens=False), min(tokenizer.eos_token_ids)]
    for token in tokens:
        constraint.fill_bitmask(words)
        if not (int(words[token // 32]) >> (token % 32)) & 1:
            return False
        if not constraint.advance(token):
            return False
    return True


def test_a_json_schema(grammars, tokenizer):
    g = OutputGrammar(json_schema=json.dumps(SCHEMA))
    assert accepts(grammars, tokenizer, g, '{"n": 3, "tags": ["x", "y"]}')
    assert not accepts(grammars, tokenizer, g, '{"n": 3, "tags": ["z"]}')  # not in the enum
    assert not accepts(grammars, tokenizer, g, '{"n": 3.5, "tags": []}')  # not an integer
    assert not accepts(grammars, tokenizer, g, '{"n": 3, "tags": [], "more": 1}')  # no extras
    assert not accepts(grammars, tokenizer, g, '{"n":3,"tags":[]}')  # json.dumps separators only


def forced(fmt, name="get_weather", parameters=CITY, several=False, **kw) -> OutputGrammar:
    shape = CallShape(name, fmt.before(name), parameters, fmt.after, fmt.pairs)
    return OutputGrammar(
        calls=(shape,),
        opening=fmt.opening,
        between=fmt.between,
        closing=fmt.closing,
        several_calls=several,
        **kw,
    )


def test_calls_between_the_models_markers_after_reasoning(grammars, tokenizer):
    g = forced(HERMES, several=True, think=("<think>", "</think>"))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(grammars, tokenizer, g, call)
    assert accepts(grammars, tokenizer, g, "<think>why not</think>\n" + call + "\n" + call)
    assert not accepts(grammars, tokenizer, g, "Sure! " + call)
    assert not accepts(grammars, tokenizer, g, call.replace("get_weather", "get_time"))
    assert not accepts(grammars, tokenizer, g, call.replace('{"city": "Paris"}', "{}"))
    assert not accepts(grammars, tokenizer, forced(HERMES), call + "\n" + call)


def test_an_open_reasoning_section_is_closed_first(grammars, tokenizer):
    g = forced(HERMES, think=("<think>", "</think>"), in_reasoning=True)
    body = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(grammars, tokenizer, g, "fine</think>" + body)
    assert not accepts(grammars, tokenizer, g, body)  # the section must be closed first


# A forced get_weather(city=Paris) in each family's syntax, as its grammar must allow it.
FORCED = {
    "hermes": (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    "llama3": (formats.LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "mistral": (
        formats.MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ),
    "mistral-args": (formats.MISTRAL_ARGS, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'),
    "harmony": (
        formats.HARMONY,
        "<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>',
    ),
    "deepseek": (
        formats.DEEPSEEK,
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
    ),
    "deepseek-v31": (
        formats.DEEPSEEK_V31,
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
        '<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
    ),
    "glm": (
        formats.GLM,
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
        "</arg_value>\n</tool_call>",
    ),
    "gemma4": (formats.GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>'),
    "function-gemma": (
        formats.FUNCTION_GEMMA,
        "<start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>",
    ),
}


@pytest.mark.parametrize("family", FORCED)
def test_each_familys_forced_call_is_its_own_syntax_and_reads_back(grammars, tokenizer, family):
    fmt, text = FORCED[family]
    g = forced(fmt, parameters=json.dumps(closed(json.loads(CITY))))
    assert accepts(grammars, tokenizer, g, text)
    assert not accepts(grammars, tokenizer, g, text.replace("get_weather", "get_time"))
    assert not accepts(grammars, tokenizer, g, "Sure. " + text)
    splitter = OutputSplitter(OutputFormat(None, fmt))
    _, _, calls = collect(splitter.feed(text) + splitter.finish())
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_a_closed_schema_ends_the_arguments_where_an_open_one_goes_on(grammars, tokenizer):
    extra = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "x": 1}}\n</tool_call>'
    )
    assert not accepts(
        grammars, tokenizer, forced(HERMES, parameters=json.dumps(closed(json.loads(CITY)))), extra
    )
    assert accepts(grammars, tokenizer, forced(HERMES), extra)  # as the client wrote it: open


def test_a_special_token_marker_is_matched_as_that_token(grammars, tokenizer):
    g = OutputGrammar(
        calls=(
            CallShape(
                "f", ("<|im_start|>", '{"name": "f", "arguments": '), "{}", ("}", "<|endoftext|>")
            ),
        )
    )
    assert "<[" in grammars._literal("<|im_start|>")
    assert accepts(
        grammars, tokenizer, g, '<|im_start|>{"name": "f", "arguments": {}}<|endoftext|>'
    )


def test_a_refusal_gives_llguidances_whole_reason(grammars):
    with pytest.raises(GrammarError) as err:
        grammars.constraint(
            OutputGrammar(json_schema=json.dumps({"type": "string", "pattern": "(a)\\1"}))
        )
    assert str(err.value) == (
        "failed to compile JSON schema: regex parse error in pattern '(a)\\1': "
        "backreferences are not supported"
    )


OBJ_A = {
    "type": "object",
    "properties": {"kind": {"const": "a"}, "x": {"type": "string"}},
    "required": ["kind"],
}
OBJ_B = {
    "type": "object",
    "properties": {"kind": {"const": "b"}, "y": {"type": "integer"}},
    "required": ["kind"],
}


def test_an_exclusive_one_of_is_enforced(grammars, tokenizer):
    tagged = {
        "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
        "$defs": {"A": OBJ_A, "B": OBJ_B},
    }
    g = OutputGrammar(json_schema=json.dumps(tagged))
    assert accepts(grammars, tokenizer, g, '{"kind": "a", "x": "hi"}')
    assert accepts(grammars, tokenizer, g, '{"kind": "b", "y": 2}')
    assert not accepts(grammars, tokenizer, g, '{"kind": "c"}')
    typed = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}
    assert accepts(grammars, tokenizer, OutputGrammar(json_schema=json.dumps(typed)), "[1, 2]")


def test_a_one_of_that_may_match_twice_is_refused_with_what_to_change(grammars):
    loose = {
        "oneOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}},
            {"type": "object", "properties": {"b": {"type": "string"}}},
        ]
    }
    with pytest.raises(GrammarError) as err:
        grammars.constraint(OutputGrammar(json_schema=json.dumps(loose)))
    assert "coerce_one_of" not in str(err.value) and "use anyOf" in str(err.value)
    assert "different const" in str(err.value)


def test_compiled_grammars_are_cached_and_states_are_fresh(grammars, tokenizer):
    g = OutputGrammar(json_schema=json.dumps({"enum": ["yes"]}))
    assert grammars.compiled(g) is grammars.compiled(g)
    first, second = grammars.constraint(g), grammars.constraint(g)
    assert first.advance(tokenizer.encode('"', add_special_tokens=False)[0])
    assert accepts(grammars, tokenizer, g, '"yes"')  # another state, untouched by the first
    del second


def test_strict_refuses_what_it_cannot_enforce_and_lenient_ignores_it(grammars):
    schema = json.dumps({"type": "string", "format": "no-such-format"})
    with pytest.raises(GrammarError, match="no-such-format"):
        grammars.constraint(OutputGrammar(json_schema=schema, strict=True))
    grammars.constraint(OutputGrammar(json_schema=schema, strict=False))


def test_token_bytes(grammars, tokenizer):
    token = tokenizer.encode(" fox", add_special_tokens=False)[0]
    assert grammars.token_bytes(token) == tokenizer.decode([token]).encode()


def test_whitespace_around_hermes_markers_is_the_models_choice(grammars, tokenizer):
    g = forced(HERMES)
    tight = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert accepts(grammars, tokenizer, g, tight)
    assert not accepts(grammars, tokenizer, g, tight.replace("<tool_call>", "<tool_call>\n\n\n"))


def test_a_one_of_a_ref_points_into_is_left_as_it_is(grammars, tokenizer):
    schema = {
        "type": "object",
        "properties": {
            "a": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "b": {"$ref": "#/properties/a/oneOf/1"},
        },
        "required": ["a", "b"],
    }
    g = OutputGrammar(json_schema=json.dumps(schema), strict=False)
    assert accepts(grammars, tokenizer, g, '{"a": "x", "b": 2}')


def one_key_objects(n: int) -> dict:
    return {
        "anyOf": [
            {"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
            for i in range(n)
        ]
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    ],
    ids=["itself", "each-other"],
)
def test_a_schema_that_only_refers_to_itself_is_refused_at_compile(grammars, schema):
    with pytest.raises(GrammarError, match=r"\$ref refers only to itself"):
        grammars.constraint(OutputGrammar(json_schema=json.dumps(schema)))


def test_a_recursive_schema_with_a_base_case_is_served(grammars, tokenizer):
    tree = {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            }
        },
        "$ref": "#/$defs/n",
    }
    assert accepts(
        grammars, tokenizer, OutputGrammar(json_schema=json.dumps(tree)), '{"c": [{"c": []}]}'
    )


def test_an_anyof_of_thousands_is_refused_as_too_large(grammars):
    with pytest.raises(GrammarError, match="too large: an anyOf of 3000"):
        grammars.constraint(OutputGrammar(json_schema=json.dumps(one_key_objects(3000))))
    params = {"type": "object", "properties": {"x": {"oneOf": one_key_objects(1001)["anyOf"]}}}
    with pytest.raises(GrammarError, match="too large: an oneOf of 1001"):
        grammars.constraint(forced(HERMES, name="t", parameters=json.dumps(params)))


def test_a_grammar_failing_mid_answer_ends_it_as_length_not_stop(grammars, tokenizer, monkeypatch):
    """Past the parser's limit (here forced: the limit check skipped) the row is cut short."""
    from omlx.adapters.grammar import llguidance
    from omlx.adapters.mlx.batch.processors import grammar_finish_reason
    from omlx.domain.generation import GenerationRequest

    monkeypatch.setattr(llguidance, "_check_alternatives", lambda schema: None)
    constraint = grammars.constraint(OutputGrammar(json_schema=json.dumps(one_key_objects(3000))))
    words = np.zeros((constraint.vocab_size + 31) // 32, dtype=np.int32)
    request = GenerationRequest(prompt_tokens=(1,), max_tokens=8, constraint=constraint)
    assert grammar_finish_reason(request, "stop") == "stop"
    for token in tokenizer.encode('{"k1": "x"}', add_special_tokens=False):
        constraint.fill_bitmask(words)
        if not constraint.advance(token):
            break
    assert constraint.failure() is not None
    assert grammar_finish_reason(request, "stop") == "length"
