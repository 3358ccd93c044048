"""``template_fit``: where messages a strict template refuses go, and that no turn's messages
are rewritten by the next turn (every reshaping stays in the run that came with it)."""

from __future__ import annotations

import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from omlx.app.chat.template_fit import TemplateLimits, fit, probe_limits

NO_LATE = TemplateLimits(late_system=False)
STRICTEST = TemplateLimits(
    system_role=False, late_system=False, tool_role=False, adjacent_user=False
)


def system(text):
    return {"role": "system", "content": text}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def call(call_id):
    function = {"name": "Bash", "arguments": {"command": "ls"}}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def tool(text, call_id="toolu_0001"):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def test_a_template_that_takes_everything_gets_the_messages_as_they_are():
    messages = [system("s"), user("u"), system("env")]
    assert fit(messages, TemplateLimits()) is messages


def test_a_late_system_message_after_a_tool_result_joins_that_result_not_the_user_turn():
    # Claude Code: its environment after the first user turn, a note after a tool result.
    messages = [
        system("rules"),
        user("fix it"),
        system("env"),
        call("toolu_0001"),
        tool("1 failed"),
        system("Tool loaded."),
    ]
    assert fit(messages, NO_LATE) == [
        system("rules"),
        user("fix it\n\nenv"),
        call("toolu_0001"),
        tool("1 failed\n\nTool loaded."),
    ]


def test_after_an_answer_a_late_system_message_joins_the_message_after_it():
    messages = [system("rules"), user("q"), assistant("a"), system("note"), user("q2")]
    assert fit(messages, NO_LATE)[-1] == user("note\n\nq2")
    # with nothing after it (the request ends there), it is a user turn of its own,
    # as it stays once the model's answer follows it
    ends = [system("rules"), user("q"), assistant("a"), system("note"), system("more")]
    assert fit(ends, NO_LATE)[-1] == user("note\n\nmore")
    answered = fit([*ends, assistant("b")], NO_LATE)
    assert answered[-2:] == [user("note\n\nmore"), assistant("b")]


def test_leading_system_messages_become_one_and_join_the_first_user_turn_without_a_system_role():
    messages = [system("a"), system("b"), user("u"), system("env")]
    assert fit(messages, NO_LATE) == [system("a\n\nb"), user("u\n\nenv")]
    assert fit(messages, STRICTEST) == [user("a\n\nb\n\nu\n\nenv")]
    assert fit([system("a"), assistant("hi")], STRICTEST) == [user("a"), assistant("hi")]


def test_user_text_after_tool_results_joins_them_where_the_template_refuses_it():
    # Claude Code's tool_result and <system-reminder> text in one user turn: a tool message
    # and a user message.
    messages = [user("q"), call("toolu_0001"), tool("r1"), tool("r2"), user("<reminder>")]
    mistral = TemplateLimits(late_system=False, adjacent_user=False)
    assert fit(messages, mistral)[2:] == [tool("r1"), tool("r2\n\n<reminder>")]
    gemma = TemplateLimits(late_system=False, tool_role=False, adjacent_user=False)
    assert fit(messages, gemma)[2:] == [user("r1\n\nr2\n\n<reminder>")]


def test_joined_messages_keep_their_images_in_order():
    picture = [{"type": "image"}, {"type": "text", "text": "what is it?"}]
    messages = [user(picture), system("env"), user("and this")]
    joined = fit(messages, TemplateLimits(late_system=False, adjacent_user=False))
    assert joined == [
        user(
            [
                {"type": "image"},
                {"type": "text", "text": "what is it?"},
                {"type": "text", "text": "\n\nenv"},
                {"type": "text", "text": "\n\nand this"},
            ]
        )
    ]


# A conversation as an agent grows it: runs of new messages, each answered by the model.
_NEW = st.sampled_from(["user", "tool", "system"])
_RUNS = st.lists(
    st.tuples(st.lists(_NEW, min_size=1, max_size=4), st.booleans()), min_size=1, max_size=6
)
_LIMITS = [TemplateLimits(*flags) for flags in itertools.product([True, False], repeat=4)]


@settings(max_examples=300, deadline=None)
@given(lead=st.integers(0, 2), runs=_RUNS, limits=st.sampled_from(_LIMITS))
@example(lead=1, runs=[(["user", "system"], False), (["system"], True)], limits=NO_LATE)
@example(lead=2, runs=[(["user"], False), (["tool", "user", "system"], True)], limits=STRICTEST)
def test_no_turn_rewrites_what_the_previous_turn_was_given(lead, runs, limits):
    texts = (f"<{i}>" for i in itertools.count())
    messages = [system(next(texts)) for _ in range(lead)]
    turns = []
    for roles, calls in runs:
        if turns:  # the model's answer to the previous turn
            messages.append(call(next(texts)) if calls else assistant(next(texts)))
        messages += [{"role": r, "content": next(texts)} for r in roles]
        turns.append(list(messages))
    for before, after in itertools.pairwise(turns):
        shaped = fit(before, limits)
        assert fit(after, limits)[: len(shaped)] == shaped
    # nothing dropped: every text is in the fitted conversation, in order
    joined = "|".join(str(m["content"]) for m in fit(turns[-1], limits))
    at = 0
    for text in (m["content"] for m in turns[-1] if m["content"]):
        at = joined.index(text, at)


def strict_render(messages):
    """A Gemma-like template in Python: no system role, strict alternation, no tool role."""
    roles = [m["role"] for m in messages]
    if roles != ["user" if i % 2 == 0 else "assistant" for i in range(len(roles))]:
        return None
    return "".join(f"<{m['role']}>{m['content']}" for m in messages)


def test_the_probes_find_what_a_template_refuses():
    assert probe_limits(strict_render) == STRICTEST
    lenient = probe_limits(lambda ms: "".join(str(m["content"]) for m in ms))
    assert lenient == TemplateLimits()
    # a template that drops late system messages without a word refuses them too
    quiet = probe_limits(
        lambda ms: "".join(
            str(m["content"]) for i, m in enumerate(ms) if m["role"] != "system" or i == 0
        )
    )
    assert quiet == TemplateLimits(late_system=False)
    # nor in place is one that gathers every system message at the front (DeepSeek's do)
    gathered = probe_limits(
        lambda ms: (
            "".join(str(m["content"]) for m in ms if m["role"] == "system")
            + "".join(str(m["content"]) for m in ms if m["role"] != "system")
        )
    )
    assert gathered == TemplateLimits(late_system=False)
    # one that refuses even a lone user message teaches nothing: messages go as they are
    assert probe_limits(lambda ms: None) == TemplateLimits()


@settings(max_examples=300, deadline=None)
@given(
    lead=st.integers(0, 2),
    runs=_RUNS,
    more=st.sampled_from(["user", "system"]),
    limits=st.sampled_from(_LIMITS),
)
@example(lead=0, runs=[(["user"], False), (["system"], False)], more="user", limits=NO_LATE)
@example(lead=1, runs=[(["user", "tool"], True)], more="user", limits=STRICTEST)
def test_a_turn_sent_again_with_a_new_message_changes_only_the_end_of_its_last_message(
    lead, runs, more, limits
):
    # A cancelled turn resent with a new user message or note: the run grows unanswered.
    messages = [system(f"<s{i}>") for i in range(lead)]
    for k, (roles, calls) in enumerate(runs):
        if k:
            messages.append(call(f"<a{k}>") if calls else assistant(f"<a{k}>"))
        messages += [{"role": r, "content": f"<{k}.{j}>"} for j, r in enumerate(roles)]
    before = fit(messages, limits)
    after = fit([*messages, {"role": more, "content": "<more>"}], limits)
    assert after[: len(before) - 1] == before[:-1]
    last, grown = before[-1], after[len(before) - 1]
    assert {**grown, "content": None} == {**last, "content": None}
    assert grown["content"].startswith(last["content"])
