"""The output splitter: reasoning, text and tool calls, however the text is chunked."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from omlx.app.output import (
    Content,
    OutputFormat,
    OutputSplitter,
    Reasoning,
    ToolCallPiece,
    collect,
)

FMT = OutputFormat(
    think=("<think>", "</think>"),
    tool=("<tool_call>", "</tool_call>"),
    tool_parser=lambda text, tools: json.loads(text),
)
CALL = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
OUTPUT = (
    "<think>step one</think>\n\nThe answer"
    + CALL
    + "\n"
    + '<tool_call>[{"name": "g", "arguments": "{}"}]</tool_call>'
)


def run(chunks: list[str], **kwargs) -> list:
    splitter = OutputSplitter(FMT, **kwargs)
    pieces = [p for chunk in chunks for p in splitter.feed(chunk)]
    return pieces + splitter.finish()


def test_whole_output_splits_into_reasoning_text_and_calls():
    text, reasoning, calls = collect(run([OUTPUT]))
    assert reasoning == "step one"
    assert text == "The answer"  # whitespace after </think> and after a call is dropped
    assert calls == [ToolCallPiece("f", '{"x": 1}'), ToolCallPiece("g", "{}")]


@given(st.lists(st.integers(min_value=1, max_value=len(OUTPUT) - 1), unique=True).map(sorted))
def test_any_chunking_gives_the_same_result(cuts):
    bounds = [0, *cuts, len(OUTPUT)]
    chunks = [OUTPUT[a:b] for a, b in itertools.pairwise(bounds)]
    assert collect(run(chunks)) == collect(run([OUTPUT]))


def test_a_partial_marker_is_held_back_until_it_resolves():
    splitter = OutputSplitter(FMT)
    assert splitter.feed("a <thi") == [Content("a ")]
    assert splitter.feed("s is text") == [Content("<this is text")]
    assert splitter.finish() == []


def test_unparsable_or_unterminated_calls_come_back_as_text():
    assert (
        collect(run(["x<tool_call>not json</tool_call>"]))[0] == "x<tool_call>not json</tool_call>"
    )
    pieces = run(['<tool_call>{"name": "f", "arguments": {}}'])  # cut by max_tokens, still parsable
    assert pieces == [ToolCallPiece("f", "{}")]
    assert collect(run(['<tool_call>{"name": ']))[0] == '<tool_call>{"name": '


def test_tools_off_leaves_markup_as_text():
    assert run([CALL], parse_tools=False) == [Content(CALL)]


def test_a_prompt_that_opens_thinking_starts_in_reasoning():
    assert FMT.opens_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not FMT.opens_in_reasoning("<think>a</think> done")
    assert run(["plan</think>answer"], in_reasoning=True) == [Reasoning("plan"), Content("answer")]


def test_a_model_without_markers_passes_text_through():
    plain = OutputSplitter(OutputFormat())
    assert plain.feed("<think>x</think>" + CALL) == [Content("<think>x</think>" + CALL)]


def test_format_is_read_from_an_mlx_lm_tokenizer_wrapper():
    class Wrapper:
        has_thinking, think_start, think_end = True, "<think>", "</think>"
        has_tool_calling, tool_call_start, tool_call_end = True, "<tool_call>", "</tool_call>"

        @staticmethod
        def tool_parser(text, tools):
            return {}

    fmt = OutputFormat.of(Wrapper())
    assert fmt.think == ("<think>", "</think>") and fmt.tool == ("<tool_call>", "</tool_call>")
    assert OutputFormat.of(object()) == OutputFormat()
