"""Stop strings cut streamed text wherever chunk boundaries fall, and name the one that matched."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from omlx.domain.generation import StopStringMatcher


def run(chunks: list[str], stops: tuple[str, ...]) -> tuple[str, StopStringMatcher]:
    matcher = StopStringMatcher(stops)
    out = "".join(matcher.feed(c) for c in chunks)
    return out + matcher.flush(), matcher


@given(st.text(alphabet="abc ", max_size=40), st.lists(st.integers(0, 40), max_size=6))
def test_output_is_the_text_up_to_the_first_stop_whatever_the_chunking(text, cuts):
    stops = ("ab", "cc")
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out, matcher = run(chunks, stops)
    hits = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    if hits:
        first, stop = min(hits)
        assert out == text[:first]
        assert matcher.stopped and matcher.matched == stop
    else:
        assert out == text
        assert not matcher.stopped and matcher.matched is None


def test_no_stops_passes_text_through():
    assert run(["hello ", "world"], ())[0] == "hello world"
