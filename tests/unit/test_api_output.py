"""The output splitter: reasoning, text and tool calls, however the text is chunked."""

from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from omlx.app.chat.output import (
    Content,
    OutputFormat,
    OutputSplitter,
    Reasoning,
    ToolCallArgs,
    ToolCallPiece,
    ToolCallStart,
    collect,
)
from omlx.app.chat.tool_calls import HERMES, formats

FMT = OutputFormat(think=("<think>", "</think>"), calls=HERMES)
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
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", "{}")]
    assert [c.index for c in calls] == [0, 1]


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
    assert pieces[-1] == ToolCallPiece("f", "{}", 0, complete=True, streamed=True)
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
    assert fmt.think == ("<think>", "</think>") and fmt.calls.family == "mlx-lm"
    assert (fmt.calls.start, fmt.calls.end) == ("<tool_call>", "</tool_call>")
    assert OutputFormat.of(object()) == OutputFormat() and OutputFormat.of(object()).calls is None


def test_a_template_names_its_family_before_mlx_lm_does():
    class Llama:
        chat_template = "{{ '<|python_tag|>' }}"
        has_tool_calling = False

    assert OutputFormat.of(Llama()).calls is formats.LLAMA3


def test_a_call_streams_its_name_then_its_arguments_as_written():
    splitter = OutputSplitter(FMT)
    out = []
    for part in [
        "<tool_",
        'call>\n{"name": "get_',
        'weather", "arguments": {"ci',
        'ty": "Pa',
        'ris"}}\n</tool_call>',
    ]:
        out.append(splitter.feed(part))
    out.append(splitter.finish())
    assert out[:2] == [[], []]  # no name yet
    assert out[2] == [ToolCallStart(0, "get_weather"), ToolCallArgs(0, '{"ci')]
    assert out[3] == [ToolCallArgs(0, 'ty": "Pa')]
    assert out[4] == [
        ToolCallArgs(0, 'ris"}'),
        ToolCallPiece("get_weather", '{"city": "Paris"}', 0, True, True),
    ]


def test_a_call_cut_inside_its_arguments_is_a_partial_call():
    pieces = run(['<tool_call>\n{"name": "f", "arguments": {"city": "Par'])
    assert pieces[-1] == ToolCallPiece("f", '{"city": "Par', 0, complete=False, streamed=True)
