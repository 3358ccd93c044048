"""The naming rules of a cache report: why the cached prefix ends where it does (``outcome``),
which message it names (a follow-up's new message, not its answer's end-of-turn markup),
how it reads in the header and the JSON."""

from __future__ import annotations

import pytest

from omlx.app.cache_controls.outcome import (
    CHANGED,
    EVICTED,
    EXTENDED,
    HIT,
    IN_FLIGHT,
    NEW_CONVERSATION,
    RESTORE_POINT,
    PromptHistory,
    first_turn,
    outcome_of,
    restored_share,
)
from omlx.app.cache_controls.report import PromptParts, report
from omlx.domain.cache.blocks import CachedPrefix

# A ChatML-like template over small integer tokens: START role words... END NL.
START, END, NL = 900, 901, 902
ROLES = {"system": 910, "user": 911, "assistant": 912}
MARKUP = {START, END, NL, *ROLES.values()}


def render(messages: list[dict], generation_prompt: bool = True) -> list[int]:
    out: list[int] = []
    for m in messages:
        out += [START, ROLES[m["role"]], *m["content"], END, NL]
    return out + ([START, ROLES["assistant"]] if generation_prompt else [])


CONVERSATION = [
    {"role": "system", "content": list(range(1, 21))},
    {"role": "user", "content": list(range(30, 40))},
    {"role": "assistant", "content": list(range(50, 58))},
    {"role": "user", "content": list(range(60, 66))},
]
PROMPT = render(CONVERSATION)
ANSWER_END = PROMPT.index(END, PROMPT.index(57))  # the answer's end-of-turn token


def parts() -> PromptParts:
    return PromptParts(
        CONVERSATION,
        ["system", "messages[0]", "messages[1]", "messages[2]"],
        lambda k: render(CONVERSATION[:k]),
    )


def made(found: CachedPrefix, history: PromptHistory | None = None):
    return report(
        found,
        PROMPT,
        lambda tokens: " ".join(map(str, tokens)),
        parts(),
        history=history,
        markup=lambda tokens: all(t in MARKUP for t in tokens),
    )


def held(tokens: int, **kw) -> CachedPrefix:
    return CachedPrefix(tokens, len(PROMPT), hot_tokens=tokens, matched=tokens, **kw)


@pytest.mark.parametrize(
    ("found", "history", "outcome"),
    [
        (held(len(PROMPT) - 1), PromptHistory(), HIT),
        (held(40, in_flight=64), PromptHistory(first_turn=True), IN_FLIGHT),
        (held(40, evicted=True), PromptHistory(), EVICTED),
        (held(40), PromptHistory(previous_shared=60), EVICTED),  # its previous prompt had them
        (held(40, stored_next=(7, 8)), PromptHistory(first_turn=True), NEW_CONVERSATION),
        (held(40, stored_next=(7, 8)), PromptHistory(previous_shared=40), CHANGED),
        (held(40), PromptHistory(previous_shared=40), EXTENDED),
        (
            CachedPrefix(32, len(PROMPT), hot_tokens=32, matched=len(PROMPT) - 1),
            PromptHistory(),
            RESTORE_POINT,
        ),
    ],
    ids=[
        "full hit",
        "in flight",
        "a kept block gone",
        "the previous prompt had more",
        "first turn",
        "other tokens stored",
        "new tokens",
        "hybrid restore point",
    ],
)
def test_the_outcome_names_why_the_cache_ends_there(found, history, outcome) -> None:
    assert outcome_of(found, history) == outcome


def test_a_first_turn_has_no_answer_or_tool_result_yet() -> None:
    assert first_turn(["system", "user", "user"])
    assert not first_turn(["system", "user", "assistant", "user"])
    assert not first_turn(["user", "tool"])


def test_restoring_no_more_than_the_templates_preamble_is_not_a_hit() -> None:
    assert [restored_share(c, 12) for c in (0, 5, 12, 13)] == [
        "none",
        "preamble",
        "preamble",
        "past_preamble",
    ]


def test_a_follow_up_that_goes_past_its_answers_end_of_turn_names_the_new_message() -> None:
    """The cache holds the previous prompt and answer but not the end-of-turn token the
    answer ended with: the prompt goes on at the new user message, not in the answer."""
    r = made(held(ANSWER_END), PromptHistory(previous_shared=ANSWER_END - 9))
    assert (r.message, r.role, r.part, r.outcome) == (3, "user", "messages[2]", EXTENDED)
    assert r.header().endswith(f"outcome=extended; diverged_at={ANSWER_END}; message=3; role=user")


def test_a_cut_answer_and_a_changed_one_stay_in_the_answer() -> None:
    cut = made(held(ANSWER_END - 1))  # its last word was never fed back: new words in it
    assert (cut.message, cut.role) == (2, "assistant")
    other = made(held(ANSWER_END, stored_next=(END, NL, START)), PromptHistory())
    assert (other.message, other.outcome) == (2, CHANGED)  # the cache holds other tokens there


def test_a_changed_system_prompt_is_changed_with_its_place_not_evicted() -> None:
    r = made(held(5, stored_next=(99, 98)), PromptHistory(previous_shared=5))
    assert (r.message, r.role, r.part, r.outcome) == (0, "system", "system", CHANGED)
    assert r.cached_next.startswith("99 98") and r.prompt_next.startswith(str(PROMPT[5]))


def test_the_header_and_json_carry_the_outcome_and_what_was_restored() -> None:
    flight = made(held(40, in_flight=24), PromptHistory(first_turn=True, preamble=3))
    assert "outcome=in_flight; in_flight=24; diverged_at=40" in flight.header()
    body = flight.as_json()
    assert (body["outcome"], body["restored"], body["preamble_tokens"]) == (
        IN_FLIGHT,
        "past_preamble",
        3,
    )
    hit = made(held(len(PROMPT) - 1, waited=True))
    assert hit.header() == f"cached={len(PROMPT) - 1}; tier=hot; computed_by=unknown; outcome=hit"
    assert hit.as_json()["waited_for_prefill"] is True
    # A hybrid's restore stops at a restore point before where the prompt leaves the KV.
    hybrid = made(CachedPrefix(32, len(PROMPT), hot_tokens=32, matched=40))
    assert "cached=32;" in hybrid.header() and "diverged_at=40;" in hybrid.header()
