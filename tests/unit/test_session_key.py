"""The session key a request names: the first of two headers and two body fields, checked."""

from __future__ import annotations

import pytest

from omlx.app.cache_controls.session_key import (
    MAX_CHARS,
    SessionKey,
    choose_session_key,
)
from omlx.app.errors import InvalidRequest

ALL = {"x-session-id": "s-1", "x-smg-routing-key": "r-1"}


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        (ALL, {"prompt_cache_key": "p-1", "metadata": {"user_id": "u-1"}}, ("s-1", "x-session-id")),
        ({"x-smg-routing-key": "r-1"}, {"prompt_cache_key": "p-1"}, ("r-1", "x-smg-routing-key")),
        ({}, {"prompt_cache_key": "p-1", "metadata": {"user_id": "u-1"}}, ("p-1", "prompt_cache_key")),
        ({}, {"metadata": {"user_id": "u-1"}}, ("u-1", "metadata.user_id")),
        # An empty value names nothing: a proxy forwarding an unset variable.
        ({"x-session-id": "", "x-smg-routing-key": "r-1"}, {}, ("r-1", "x-smg-routing-key")),
        ({}, {"prompt_cache_key": "", "metadata": {"user_id": "u-1"}}, ("u-1", "metadata.user_id")),
        ({}, {"metadata": {"user_id": "x" * MAX_CHARS}}, ("x" * MAX_CHARS, "metadata.user_id")),
        ({"x-session-id": "Zoë's session 7"}, {}, ("Zoë's session 7", "x-session-id")),
    ],
    ids=["header first", "routing key next", "prompt_cache_key", "user_id", "empty header",
         "empty field", "at the limit", "unicode and spaces"],
)  # fmt: skip
def test_the_first_source_that_names_a_session_wins(headers, body, expected) -> None:
    assert choose_session_key(headers, **body) == SessionKey(*expected)


@pytest.mark.parametrize(
    "body", [{}, {"metadata": None}, {"metadata": {"other": 1}}, {"metadata": ["user_id"]}]
)
def test_no_source_names_no_session(body) -> None:
    assert choose_session_key({"content-type": "application/json"}, **body) is None


@pytest.mark.parametrize(
    ("headers", "body", "param", "says"),
    [
        ({"x-session-id": "s" * (MAX_CHARS + 1)}, {}, "x-session-id", "513 characters"),
        ({"x-smg-routing-key": "a\tb"}, {}, "x-smg-routing-key", "control character"),
        ({}, {"prompt_cache_key": "k" * 600}, "prompt_cache_key", "at most 512"),
        ({}, {"metadata": {"user_id": 42}}, "metadata.user_id", "must be a string"),
        ({}, {"metadata": {"user_id": "u\x00"}}, "metadata.user_id", "control character"),
        # A bad value is refused wherever it stands, not only when it would have been chosen.
        ({"x-session-id": "ok"}, {"metadata": {"user_id": "\x1b[31m"}}, "metadata.user_id", "control"),
    ],
)  # fmt: skip
def test_a_malformed_key_is_a_400_naming_where_it_came_from(headers, body, param, says) -> None:
    with pytest.raises(InvalidRequest) as refused:
        choose_session_key(headers, **body)
    assert refused.value.param == param and says in refused.value.message
