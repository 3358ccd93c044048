"""Cache-miss diagnostics: which part of a request changed, and at which token."""

from __future__ import annotations

from omlx.app.chat.diagnostics import FingerprintStore, compare, fingerprint, shared_tokens

SYSTEM = {"role": "system", "content": "You are terse."}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


def fp(messages, labels, tokens, tools=TOOLS, model="m"):
    return fingerprint(model, messages, labels, tools, tokens)


def turn(*texts):
    messages = [SYSTEM, *({"role": "user", "content": t} for t in texts)]
    labels = ["system", *(f"messages[{i}]" for i in range(len(texts)))]
    return messages, labels


def test_a_turn_that_extends_the_previous_one_is_no_miss():
    prev = fp(*turn("hi"), list(range(100)))
    cur = fp(*turn("hi", "more"), list(range(120)))
    assert compare(prev, cur) is None


def test_each_part_that_changes_is_named_with_the_token_where_prompts_part():
    prev = fp(*turn("hi", "there"), list(range(100)))
    edited = fp(*turn("hi", "THERE"), [*range(70), 9, 9])
    d = compare(prev, edited)
    assert (d.reason, d.part, d.token, d.missed_tokens) == (
        "messages_changed",
        "messages[1]",
        70,
        30,
    )
    other_system = fp([{"role": "system", "content": "x"}, *turn("hi")[0][1:]], turn("hi")[1], [5])
    assert compare(prev, other_system).reason == "system_changed"
    other_tools = fp(*turn("hi", "there"), list(range(100)), tools=[])
    assert compare(prev, other_tools).reason == "tools_changed"
    other_model = fp(*turn("hi", "there"), list(range(100)), model="n")
    assert (compare(prev, other_model).reason, compare(prev, other_model).missed_tokens) == (
        "model_changed",
        100,
    )


def test_shared_tokens_is_the_common_prefix():
    a = fp(*turn("x"), [1, 2, 3, 4, 5]).tokens
    b = fp(*turn("x"), [1, 2, 3, 9]).tokens
    assert shared_tokens(a, b) == 3 and shared_tokens(a, a) == 5 and shared_tokens(a, b[:0]) == 0


def test_the_closest_recent_turn_is_the_conversation_s_previous_one():
    store = FingerprintStore(limit=3)
    first = fp(*turn("a"), list(range(200)))
    sibling = fp(*turn("b"), [*range(64), *range(1000, 1100)])
    store.record(None, "r1", first)
    store.record(None, "r2", sibling)
    follow_up = fp(*turn("a", "next"), [*range(200), 7, 7])
    assert store.closest(None, follow_up) is first
    assert store.closest(None, fp(*turn("z"), [42] * 100)) is None  # nothing shares a block
    assert store.closest(None, fp(*turn("a"), list(range(200)), model="other")) is None
    for i in range(3):
        store.record(None, f"x{i}", sibling)
    assert store.get(None, "r1") is None  # bounded: the oldest went first


def test_a_tenant_s_turns_are_compared_with_its_own_alone():
    store = FingerprintStore()
    alice = fp(*turn("a"), list(range(200)))
    store.record("alice", "r1", alice)
    follow_up = fp(*turn("a", "next"), [*range(200), 7])
    assert store.closest("alice", follow_up) is alice
    assert store.closest("bob", follow_up) is None  # bob never learns alice's prompt was there
    assert store.closest(None, follow_up) is None
    assert store.get("bob", "r1") is None and store.get("alice", "r1") is alice
