"""Reusing a growing conversation's tokens gives exactly the tokenizer's own encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from omlx.adapters.mlx.models.prompt_tokens import (
    MIN_REUSE_CHARS,
    PrefixReusingEncoder,
    fast_backend,
)
from tests.agent_model import build_agent_model
from tests.tiny_model import build_tokenizer

# Text that stresses merges at the seams: spaces, newlines, digits, code, non-ASCII.
PIECES = [
    "def f(x):\n    return x + 1\n",
    "  ",
    "\n\n",
    "12345",
    "naïve café ",
    "<not special>",
    "Hello there. ",
    "tool_call",
    "\t",
    "ünïcödé ✓ ",
    "a" * 40,
    " the quick brown fox ",
]
ROLES = ["system", "user", "assistant", "tool"]


def render(turns: list[tuple[str, str]]) -> str:
    return (
        "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
        + "<|im_start|>assistant\n"
    )


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    root = tmp_path_factory.mktemp("tokenizers")
    build_tokenizer(root)
    agent = build_agent_model(root / "agent")
    found = {
        "tiny": Tokenizer.from_file(str(root / "tokenizer.json")),
        "agent": Tokenizer.from_file(str(agent / "tokenizer.json")),
    }
    smollm = Path("/tmp/omlx-bench/smollm2-mlx/tokenizer.json")  # made by bench/ when it exists
    if smollm.exists():
        found["smollm2"] = Tokenizer.from_file(str(smollm))
    return found


text_piece = st.lists(st.sampled_from(PIECES), min_size=1, max_size=30).map("".join)
turn = st.tuples(st.sampled_from(ROLES), text_piece)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=st.lists(turn, min_size=1, max_size=12),
    growth=st.lists(st.lists(turn, min_size=1, max_size=3), min_size=1, max_size=4),
)
def test_growing_conversations_encode_as_a_whole(tokenizers, history, growth):
    filler = [("system", "You are a careful coding assistant. " * (MIN_REUSE_CHARS // 30))]
    for tok in tokenizers.values():
        encoder = PrefixReusingEncoder(tok)
        turns = filler + history
        for more in growth:
            text = render(turns)
            assert encoder.encode(text) == tok.encode(text, add_special_tokens=False).ids
            turns = turns + more
        # an edit in the middle (a rewritten history) is encoded right too
        edited = render([*filler, ("user", "changed"), *turns[len(filler) + 1 :]])
        assert encoder.encode(edited) == tok.encode(edited, add_special_tokens=False).ids


def test_a_follow_up_reuses_the_previous_tokens(tokenizers):
    tok = tokenizers["tiny"]
    encoder = PrefixReusingEncoder(tok)
    turns = [("system", "You are a careful coding assistant. " * 100), ("user", "hi")]
    first = encoder.encode(render(turns))
    second = encoder.encode(render([*turns, ("assistant", "hello"), ("user", "and?")]))
    assert encoder.reused_tokens > 0.9 * len(first)
    assert second[: encoder.reused_tokens] == first[: encoder.reused_tokens]


def test_tokens_that_strip_whitespace_are_never_cut_points(tmp_path):
    from tokenizers import AddedToken

    build_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<|sep|>", lstrip=True, rstrip=True)])
    encoder = PrefixReusingEncoder(tok)
    assert tok.token_to_id("<|sep|>") not in encoder.cut_ids
    assert tok.token_to_id("<|im_start|>") in encoder.cut_ids


def test_the_fast_backend_is_found_behind_mlx_lm_and_hugging_face_wrappers(tmp_path):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from tests.tiny_model import build_tiny_model

    folder = build_tiny_model(tmp_path / "m")
    wrapper = load_tokenizer(folder)
    backend = fast_backend(wrapper)
    assert backend is not None
    text = render([("system", "x " * 2000), ("user", "hi")])
    assert PrefixReusingEncoder(backend).encode(text) == list(
        wrapper.encode(text, add_special_tokens=False)
    )


def test_encoding_releases_the_gil_so_other_threads_run(tokenizers):
    """A long prompt tokenizes on a worker thread without stalling the event loop's thread."""
    import threading
    import time

    encoder = PrefixReusingEncoder(tokenizers["tiny"])
    text = "hello world, the quick brown fox " * 40_000  # 1.3 M characters
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            start = time.monotonic()
            time.sleep(0.002)
            gaps.append(time.monotonic() - start)

    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.monotonic()
    encoder.encode(text)
    took = time.monotonic() - started
    done.set()
    ticker.join()
    assert took > 0.05, "the text must take long enough to measure the stall"
    assert max(gaps) < max(0.05, took / 4), (took, max(gaps))


def test_prompts_at_the_limit_are_not_remembered(tokenizers):
    tok = tokenizers["tiny"]
    long_text = render([("user", "word " * 4000)])
    limit = len(tok.encode(long_text, add_special_tokens=False).ids)
    encoder = PrefixReusingEncoder(tok, max_tokens=limit)
    assert len(encoder.encode(long_text)) == limit
    assert encoder._recent == []  # refused by the context: forgotten at once
    short = render([("user", "word " * 1000)])
    encoder.encode(short)
    assert [e.text for e in encoder._recent] == [short]
