"""Tool-call formats of each family: found from a small template of the family's own
syntax, read back from what such a model writes, streamed however the text is chunked."""

from __future__ import annotations

import json
from typing import Any

import jinja2
import pytest

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
from omlx.app.chat.templates import ChatRenderer
from omlx.app.chat.tool_calls import formats

# Each family's template: a few lines that render the tools and earlier calls its way.
_TOOLS = "{% for t in tools %}{{ t.function | tojson }}{% endfor %}"
_CALLS = "{% for c in m.tool_calls %}CALL{% endfor %}"


def calls(syntax: str) -> str:
    return _CALLS.replace("CALL", syntax)


TEMPLATES = {
    "hermes": "<tools>"
    + _TOOLS
    + "</tools>"
    + calls(
        '<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>'
    ),
    "llama3": 'Respond in the format {"name": function name, "parameters": dictionary of argument name '
    "and its value}."
    + _TOOLS
    + calls(
        '{{ "<|python_tag|>" }}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}'
    ),
    "mistral": "[AVAILABLE_TOOLS]"
    + _TOOLS
    + "[/AVAILABLE_TOOLS]"
    + calls(
        '[TOOL_CALLS][{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}]'
    ),
    "mistral-args": "[AVAILABLE_TOOLS]"
    + _TOOLS
    + "[/AVAILABLE_TOOLS]"
    + calls("[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}"),
    "harmony": "# Tools\nnamespace functions { "
    + _TOOLS
    + " }"
    + calls(
        "<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }} "
        "<|constrain|>json<|message|>{{ c.function.arguments | tojson }}<|call|>"
    ),
    "deepseek": _TOOLS
    + calls(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}\n```json\n"
        "{{ c.function.arguments | tojson }}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "deepseek-v31": _TOOLS
    + calls(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>"
        "{{ c.function.arguments | tojson }}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "glm": _TOOLS
    + calls(
        "<tool_call>{{ c.function.name }}\n{% for k, v in c.function.arguments.items() %}"
        "<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n{% endfor %}</tool_call>"
    ),
    "gemma4": _TOOLS + calls("<|tool_call>call:{{ c.function.name }}{...}<tool_call|>"),
    "function-gemma": _TOOLS
    + calls("<start_function_call>call:{{ c.function.name }}{...}<end_function_call>"),
}
FAMILY = {
    "hermes": formats.HERMES,
    "llama3": formats.LLAMA3,
    "mistral": formats.MISTRAL,
    "mistral-args": formats.MISTRAL_ARGS,
    "harmony": formats.HARMONY,
    "deepseek": formats.DEEPSEEK,
    "deepseek-v31": formats.DEEPSEEK_V31,
    "glm": formats.GLM,
    "gemma4": formats.GEMMA4,
    "function-gemma": formats.FUNCTION_GEMMA,
}
PARIS = {"city": "Paris", "days": 3}
# What a model of each family writes for get_weather(city=Paris, days=3), and after.
OUTPUTS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]',
    "mistral-args": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
    "harmony": "<|channel|>analysis<|message|>Weather, then.<|end|><|start|>assistant<|channel|>"
    'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}',
    "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek-v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
    "function-gemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>,days:3}"
    "<end_function_call>",
}
STREAMS = {"hermes", "llama3", "mistral", "mistral-args", "harmony", "deepseek", "deepseek-v31"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


class JinjaTokenizer:
    """A tokenizer that only renders its chat template (with jinja2, as transformers does)."""

    has_thinking = False
    has_tool_calling = False

    def __init__(self, template: str) -> None:
        self.chat_template = (
            "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
            + template.replace("{% for t in tools %}", "{% for t in tools or [] %}").replace(
                "{% for c in m.tool_calls %}", "{% for c in m.tool_calls or [] %}"
            )
            + "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
        )

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, **kw: Any) -> str:
        env = jinja2.Environment()
        return env.from_string(self.chat_template).render(messages=messages, **kw)


def split(fmt: OutputFormat, chunks: list[str]) -> list:
    splitter = OutputSplitter(fmt)
    return [p for c in chunks for p in splitter.feed(c)] + splitter.finish()


@pytest.mark.parametrize("family", TEMPLATES)
def test_each_family_is_found_from_its_template_which_renders_the_tools(family):
    tokenizer = JinjaTokenizer(TEMPLATES[family])
    fmt = OutputFormat.of(tokenizer)
    assert fmt.calls is FAMILY[family]
    assert ChatRenderer(tokenizer, "m").renders_tools()


@pytest.mark.parametrize("family", OUTPUTS)
def test_each_family_output_is_read_back_whole_or_a_character_at_a_time(family):
    calls = FAMILY[family]
    fmt = OutputFormat(calls.think, calls)
    text = OUTPUTS[family]
    for chunks in ([text], list(text)):
        _, reasoning, found = collect(split(fmt, chunks))
        assert [(c.name, json.loads(c.arguments)) for c in found] == [("get_weather", PARIS)]
        assert found[0].complete
    if family == "harmony":
        assert reasoning == "Weather, then."
        assert collect(split(fmt, [text]))[0] == ""  # the channel framing is not text


@pytest.mark.parametrize("family", sorted(STREAMS))
def test_json_argument_families_stream_the_arguments_as_written(family):
    calls = FAMILY[family]
    pieces = split(OutputFormat(calls.think, calls), list(OUTPUTS[family]))
    starts = [p for p in pieces if isinstance(p, ToolCallStart)]
    fragments = [p.text for p in pieces if isinstance(p, ToolCallArgs)]
    assert starts == [ToolCallStart(0, "get_weather")]
    assert len(fragments) > 5 and json.loads("".join(fragments)) == PARIS
    whole = [p for p in pieces if isinstance(p, ToolCallPiece)]
    assert whole[0].streamed and whole[0].arguments == "".join(fragments)
    first_args = next(i for i, p in enumerate(pieces) if isinstance(p, ToolCallArgs))
    assert pieces.index(starts[0]) < first_args < pieces.index(whole[0])


@pytest.mark.parametrize("family", sorted(STREAMS - {"harmony", "llama3"}))
def test_a_call_cut_inside_its_arguments_is_a_partial_call(family):
    calls = FAMILY[family]
    text = OUTPUTS[family]
    cut = text[: text.index('"Paris"') + 4]
    pieces = split(OutputFormat(calls.think, calls), [cut])
    (call,) = [p for p in pieces if isinstance(p, ToolCallPiece)]
    assert call.name == "get_weather" and not call.complete
    assert call.arguments == '{"city": "Par'
    assert not [p for p in pieces if isinstance(p, Content)]


def test_several_mistral_calls_in_one_list_and_in_repeated_markers():
    fmt = OutputFormat(None, formats.MISTRAL)
    text = '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    assert [(c.name, c.index) for c in collect(split(fmt, list(text)))[2]] == [("a", 0), ("b", 1)]
    fmt = OutputFormat(None, formats.MISTRAL_ARGS)
    text = '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}'
    assert [c.name for c in collect(split(fmt, [text]))[2]] == ["a", "b"]


def test_llama_text_that_is_not_a_call_stays_text():
    fmt = OutputFormat(None, formats.LLAMA3)
    assert collect(split(fmt, list("{not a call} at all")))[0] == "{not a call} at all"
    assert collect(split(fmt, ["Sure: ", '{"name": "x"}']))[2] == []  # not at the start
    text = '<|python_tag|>{"name": "f", "parameters": {"q": "x"}}'
    assert collect(split(fmt, [text]))[2][0].name == "f"


def test_an_unparsable_glm_call_is_text_and_a_bad_gemma_one_too():
    assert split(OutputFormat(None, formats.GLM), ["<tool_call>not a name!</tool_call>"]) == [
        Content("<tool_call>not a name!</tool_call>")
    ]
    assert split(OutputFormat(None, formats.GEMMA4), ["<|tool_call>nonsense<tool_call|>"]) == [
        Content("<|tool_call>nonsense<tool_call|>")
    ]


def test_reasoning_before_a_hermes_call():
    fmt = OutputFormat(("<think>", "</think>"), formats.HERMES)
    pieces = split(fmt, ["<think>hm</think>\n", OUTPUTS["hermes"]])
    assert pieces[0] == Reasoning("hm") and collect(pieces)[2][0].name == "get_weather"


def test_a_template_that_renders_no_tools_gets_them_in_the_system_turn(caplog):
    tokenizer = JinjaTokenizer("")
    renderer = ChatRenderer(tokenizer, "plain")
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
    ]
    with caplog.at_level("INFO"):
        text = renderer.render(history, [WEATHER])
        renderer.render(history, [WEATHER])
    assert text.startswith("<system># Tools") and '"name": "get_weather"' in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert sum("renders no tools" in r.message for r in caplog.records) == 1  # once per model
    # The next turn's prompt starts with this one's (what the prefix cache restores).
    longer = renderer.render(
        [
            *history,
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "thanks"},
        ],
        [WEATHER],
    )
    assert longer.startswith(text.removesuffix("<assistant>"))
