"""Output grammars compiled by llguidance for a real tokenizer, walked token by token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from omlx.adapters.grammar import LLGuidanceCompiler
from omlx.domain.grammar import GrammarError, OutputGrammar, ToolSpec

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


def test_calls_between_the_models_markers_after_reasoning(grammars, tokenizer):
    g = OutputGrammar(
        tools=(ToolSpec("get_weather", CITY),),
        call_markers=("<tool_call>", "</tool_call>"),
        several_calls=True,
        think=("<think>", "</think>"),
    )
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(grammars, tokenizer, g, call)
    assert accepts(grammars, tokenizer, g, "<think>why not</think>\n" + call + "\n" + call)
    assert not accepts(grammars, tokenizer, g, "Sure! " + call)
    assert not accepts(grammars, tokenizer, g, call.replace("get_weather", "get_time"))
    assert not accepts(grammars, tokenizer, g, call.replace('{"city": "Paris"}', "{}"))
    one = OutputGrammar(tools=g.tools, call_markers=g.call_markers)
    assert not accepts(grammars, tokenizer, one, call + "\n" + call)


def test_a_bare_call_and_an_open_reasoning_section(grammars, tokenizer):
    g = OutputGrammar(
        tools=(ToolSpec("get_weather", CITY),), think=("<think>", "</think>"), in_reasoning=True
    )
    body = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert accepts(grammars, tokenizer, g, "fine</think>" + body)
    assert not accepts(grammars, tokenizer, g, body)  # the section must be closed first


def test_a_special_token_marker_is_matched_as_that_token(grammars, tokenizer):
    g = OutputGrammar(tools=(ToolSpec("f", "{}"),), call_markers=("<|im_start|>", "<|endoftext|>"))
    assert "<[" in grammars._literal("<|im_start|>")
    assert accepts(
        grammars, tokenizer, g, '<|im_start|>{"name": "f", "arguments": {}}<|endoftext|>'
    )


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


def one_key_objects(n: int) -> dict:
    return {
        "anyOf": [
            {"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
            for i in range(n)
        ]
    }


@pytest.mark.parametrize(
    "schema",
    [{"$ref": "#"}, {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}],
    ids=["itself", "each-other"],
)
def test_a_schema_that_only_refers_to_itself_is_refused_at_compile(grammars, schema):
    with pytest.raises(GrammarError, match=r"\$ref refers only to itself"):
        grammars.constraint(OutputGrammar(json_schema=json.dumps(schema)))


def test_a_recursive_schema_with_a_base_case_is_served(grammars, tokenizer):
    tree = {"$defs": {"n": {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
            "$ref": "#/$defs/n"}
    assert accepts(grammars, tokenizer, OutputGrammar(json_schema=json.dumps(tree)), '{"c": [{"c": []}]}')


def test_an_anyof_of_thousands_is_refused_as_too_large(grammars):
    with pytest.raises(GrammarError, match="too large: an anyOf of 3000"):
        grammars.constraint(OutputGrammar(json_schema=json.dumps(one_key_objects(3000))))
    tool = ToolSpec("t", json.dumps({"type": "object", "properties": {"x": {"oneOf": one_key_objects(1001)["anyOf"]}}}))
    with pytest.raises(GrammarError, match="too large: an oneOf of 1001"):
        grammars.constraint(OutputGrammar(tools=(tool,)))


def test_a_grammar_failing_mid_answer_ends_it_as_length_not_stop(grammars, tokenizer, monkeypatch):
    """Past the parser's limit (here forced: the limit check skipped) the row is cut short."""
    from omlx.adapters.grammar import llguidance
    from omlx.adapters.mlx.processors import grammar_finish_reason
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
