"""Speculative decoding on the tiny model: the same tokens as plain decoding, whatever the
drafts, alone or batched, with grammars, stop strings, logprobs and the prefix cache.

The tiny model's random weights rarely repeat their prompt, so most tests draft from an
``Oracle``: it knows the plain run's tokens and proposes them with every few positions
wrong, so drafts are partly accepted and the rejection path runs on every step. Prompt
lookup is forced to draft (``margin=0``) for the rest.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence

import pytest

from omlx.adapters.grammar import LLGuidanceCompiler
from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.mlx.cache.finished_caches import FinishedCaches
from omlx.adapters.mlx.models.draft_model import DraftModel, TokenizerMismatch, check_same_tokenizer
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.generation import TextDelta
from omlx.domain.grammar import OutputGrammar
from omlx.domain.speculation import DRAFT_MODEL, LOOKUP, SpeculationConfig
from tests.engine_helpers import generate, greedy, submit
from tests.integration.test_prefix_restore import RecordingPrefixCache
from tests.tiny_model import build_tiny_model

FORCED = SpeculationConfig(margin=0.0)  # draft whenever anything is offered

TOPICS = [
    "Tell me about the sea",
    "List three colours",
    "def add(a, b): return a + b  # explain",
    "Write a haiku about rust",
    "What is 2 + 2?",
    "Repeat after me: the quick brown fox jumps over the lazy dog",
    "Summarise: caching saves work by keeping results",
    "Translate 'good morning' into French",
]


class Oracle:
    """Proposes the plain run's next tokens, about one in ``wrong_every`` made wrong."""

    method = LOOKUP
    free = False

    def __init__(
        self, references: Sequence[Sequence[int]], vocab: int, wrong_every: int = 4
    ) -> None:
        self.references = [list(r) for r in references]
        self.vocab = vocab
        self.wrong_every = wrong_every
        self.calls = 0

    def propose(
        self,
        uid: int,
        tokens: Sequence[int],
        pending: int,
        limit: int,
        choose: Callable[[int], int],
    ) -> list[int]:
        self.calls += 1
        context = [*tokens, pending]
        for ref in self.references:
            if ref[: len(context)] == context and len(ref) > len(context):
                ahead = ref[len(context) : len(context) + limit]
                drafts = ahead[: choose(len(ahead))]
                return [
                    (t + 1) % self.vocab if self._wrong(len(context) + j) else t
                    for j, t in enumerate(drafts)
                ]
        return []

    def _wrong(self, position: int) -> bool:
        """Wrong at about one position in ``wrong_every``, the same ones every run (not a
        fixed stride, which a fixed draft length could step over)."""
        return random.Random(position).random() < 1 / self.wrong_every

    def forget(self, uid: int) -> None:
        pass


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def started(
    model, config: SpeculationConfig | None = None, proposer=None, prefix_cache=None, **kw
) -> MLXEngine:
    engine = MLXEngine(
        model,
        prefix_cache,
        EngineConfig(max_concurrent=4, prefill_step_size=32, speculation=config, **kw),
        proposer=proposer,
    )
    engine.start()
    return engine


@pytest.fixture(scope="module")
def plain(tiny):
    engine = started(tiny)
    yield engine
    engine.stop()


def prompt_of(model, text: str) -> list[int]:
    return model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )


def tokens_of(run) -> list[int]:
    return [e.token for ev in run.events if isinstance(ev, TextDelta) for e in ev.logprobs]


def _greedy(prompt, n, **fields):
    from omlx.domain.generation import GenerationRequest, SamplingParams

    return GenerationRequest(tuple(prompt), n, SamplingParams(temperature=0.0), **fields)


def test_forced_lookup_drafts_give_the_plain_tokens(tiny, plain):
    prompts = [prompt_of(tiny, t) for t in TOPICS]
    expected = [tokens_of(generate(plain, _greedy(p, 40, logprobs=0))) for p in prompts]
    engine = started(tiny, FORCED)
    try:
        runs = [generate(engine, _greedy(p, 40, logprobs=0)) for p in prompts]
    finally:
        engine.stop()
    assert [tokens_of(r) for r in runs] == expected
    drafted = sum(r.finished.speculation.drafted for r in runs)
    assert drafted > 0, "the random model repeats itself somewhere: lookup should have drafted"


@pytest.mark.parametrize("wrong_every", [2, 3, 5, 1000])
def test_drafts_partly_wrong_never_change_the_greedy_tokens(tiny, plain, wrong_every):
    prompts = [prompt_of(tiny, t) for t in TOPICS[:5]]
    plain_runs_ = [generate(plain, _greedy(p, 32, logprobs=0)) for p in prompts]
    expected = [tokens_of(r) for r in plain_runs_]
    oracle = Oracle(
        [[*p, *e] for p, e in zip(prompts, expected, strict=True)], len(tiny.tokenizer), wrong_every
    )
    engine = started(tiny, FORCED, oracle)
    try:
        runs = [generate(engine, _greedy(p, 32, logprobs=0)) for p in prompts]
    finally:
        engine.stop()
    assert [tokens_of(r) for r in runs] == expected
    summaries = [r.finished.speculation for r in runs]
    drafted = sum(s.drafted for s in summaries)
    accepted = sum(s.accepted for s in summaries)
    assert drafted > 0 and accepted > 0
    if wrong_every < 1000:
        assert accepted < drafted  # the rejection path ran
    else:
        steps = sum(s.steps for s in summaries)
        # All drafts right: each verify pass hands out several tokens.
        assert steps < sum(len(e) for e in expected) / 3
    # The same log-probabilities as plain decoding (same model, same positions).
    for run, ref in zip(runs, plain_runs_, strict=True):
        got = [e.logprob for ev in run.events if isinstance(ev, TextDelta) for e in ev.logprobs]
        want = [e.logprob for ev in ref.events if isinstance(ev, TextDelta) for e in ev.logprobs]
        assert got == pytest.approx(want, abs=1e-4)


def test_the_pipelined_steps_give_the_plain_tokens(tiny, plain):
    """mlx-lm's pipelined decode steps (Metal, CUDA) run here too when asked: lookup first
    looks ahead from the tokens already out, and waits for the pending one only to draft."""
    prompts = [prompt_of(tiny, t) for t in TOPICS]
    expected = [tokens_of(generate(plain, _greedy(p, 40, logprobs=0))) for p in prompts]
    engine = started(tiny, FORCED, in_order=False)
    try:
        runs = [generate(engine, _greedy(p, 40, logprobs=0)) for p in prompts]
        assert engine._generator._generation_batch.in_order is False
    finally:
        engine.stop()
    assert [tokens_of(r) for r in runs] == expected
    assert sum(r.finished.speculation.accepted for r in runs) > 0


def test_batched_rows_with_and_without_drafts(tiny, plain):
    """Three rows decode together; the oracle knows one row's text only (the steps stay
    plain: a row without drafts makes the step plain for all), then all three."""
    prompts = [prompt_of(tiny, t) for t in TOPICS[:3]]
    expected = [tokens_of(generate(plain, _greedy(p, 28, logprobs=0))) for p in prompts]
    config = SpeculationConfig(margin=0.0, max_rows=4)
    for known in ([0], [0, 1, 2]):
        oracle = Oracle([[*prompts[i], *expected[i]] for i in known], len(tiny.tokenizer), 1000)
        engine = started(tiny, config, oracle)
        try:
            runs = [submit(engine, _greedy(p, 28, logprobs=0)) for p in prompts]
            for run in runs:
                assert run.done.wait(120)
        finally:
            engine.stop()
        assert [tokens_of(r) for r in runs] == expected
        accepted = sum(r.finished.speculation.accepted for r in runs)
        assert accepted > 0 if len(known) == 3 else accepted == 0


def test_a_grammar_constrained_request_with_drafts(tiny, plain):
    grammars = LLGuidanceCompiler(
        tiny.tokenizer, sorted(tiny.tokenizer.eos_token_ids), tiny.config["vocab_size"]
    )
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["n", "tags"],
        "additionalProperties": False,
    }
    grammar = OutputGrammar(json_schema=json.dumps(schema))
    prompt = prompt_of(tiny, "Give me JSON")

    def request():
        return _greedy(prompt, 40, logprobs=0, constraint=grammars.constraint(grammar))

    reference = generate(plain, request())
    assert reference.text.startswith('{"n": ')
    # Every other draft wrong: most wrong drafts break the grammar and are cut before the
    # pass; the rest are refused by the masked logits.
    oracle = Oracle([[*prompt, *tokens_of(reference)]], len(tiny.tokenizer), 2)
    engine = started(tiny, FORCED, oracle)
    try:
        run = generate(engine, request())
        again = generate(engine, request())  # the grammar state is per request
    finally:
        engine.stop()
    assert run.text == reference.text == again.text
    assert run.finished.reason == reference.finished.reason
    assert run.finished.speculation.accepted > 0


def test_stop_strings_and_max_tokens_end_where_plain_decoding_does(tiny, plain):
    prompt = prompt_of(tiny, TOPICS[0])
    full = generate(plain, greedy(prompt, 40))
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    assert stop.strip()
    expected = [generate(plain, greedy(prompt, 40, (stop,))), generate(plain, greedy(prompt, 7))]
    reference = [*prompt, *tokens_of(generate(plain, _greedy(prompt, 40, logprobs=0)))]
    engine = started(tiny, FORCED, Oracle([reference], len(tiny.tokenizer), 1000))
    try:
        got = [generate(engine, greedy(prompt, 40, (stop,))), generate(engine, greedy(prompt, 7))]
    finally:
        engine.stop()
    for g, e in zip(got, expected, strict=True):
        assert g.text == e.text
        assert g.finished.reason == e.finished.reason
        assert g.finished.completion_tokens == e.finished.completion_tokens


def test_blocks_stored_after_a_speculative_turn_equal_a_plain_turns(tiny, plain):
    """Same keys, same tokens, same KV: no refused draft reaches a tier."""
    import mlx.core as mx

    prompt = prompt_of(tiny, TOPICS[5] * 3)
    reference = [*prompt, *tokens_of(generate(plain, _greedy(prompt, 48, logprobs=0)))]
    tiers = {}
    for name, config, proposer in [
        ("plain", None, None),
        ("speculative", FORCED, Oracle([reference], len(tiny.tokenizer), 3)),
    ]:
        hot = HotTier(1 << 30)
        cache = RecordingPrefixCache(
            namespace=tiny.namespace(8), codec=MLXKVCodec(), hot=hot, kept=FinishedCaches(2)
        )
        engine = started(tiny, config, proposer, prefix_cache=cache)
        try:
            run = generate(engine, greedy(prompt, 48))
        finally:
            engine.stop()
        if config is not None:
            assert run.finished.speculation.accepted > 0
        tiers[name] = (cache.stored, {k: hot.get(k) for k in list(hot.keys())})
    (stored_plain, blocks_plain), (stored_spec, blocks_spec) = tiers["plain"], tiers["speculative"]
    assert stored_spec == stored_plain
    assert sorted(blocks_spec) == sorted(blocks_plain) and len(blocks_plain) > len(prompt) // 8
    for key, block in blocks_plain.items():
        other = blocks_spec[key]
        assert other.tokens == block.tokens
        for a, b in (
            (block.payload.keys, other.payload.keys),
            (block.payload.values, other.payload.values),
        ):
            assert a.shape == b.shape and mx.allclose(a, b, atol=1e-4).item()


def test_a_cancelled_speculative_request_leaves_the_engine_sound(tiny, plain):
    prompt = prompt_of(tiny, TOPICS[1])
    reference = [*prompt, *tokens_of(generate(plain, _greedy(prompt, 200, logprobs=0)))]
    expected = generate(plain, greedy(prompt, 30)).text
    engine = started(tiny, FORCED, Oracle([reference], len(tiny.tokenizer), 4))
    try:
        run = submit(engine, greedy(prompt, 200))
        deadline = time.monotonic() + 60
        while not any(isinstance(e, TextDelta) for e in run.events):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        engine.cancel(run.job_id)
        assert run.done.wait(60)
        assert generate(engine, greedy(prompt, 30)).text == expected
    finally:
        engine.stop()


def test_a_draft_model_drafts_and_keeps_the_plain_tokens(tiny, plain, tmp_path):
    """The served model as its own draft (all drafts right), then another random model
    with the same tokenizer (drafts mostly wrong): the plain tokens both times."""
    prompts = [prompt_of(tiny, t) for t in TOPICS[:4]]
    expected = [tokens_of(generate(plain, _greedy(p, 24, logprobs=0))) for p in prompts]
    other = load_model(str(build_tiny_model(tmp_path / "other", seed=7)))
    check_same_tokenizer(other.tokenizer, tiny.tokenizer, "other", "tiny")
    config = SpeculationConfig(method=DRAFT_MODEL, margin=0.0, max_draft=5)
    rates = []
    for draft in (tiny, other):
        engine = started(tiny, config, DraftModel(draft.model, draft.model_id, window=64))
        try:
            runs = [generate(engine, _greedy(p, 24, logprobs=0)) for p in prompts]
        finally:
            engine.stop()
        assert [tokens_of(r) for r in runs] == expected
        summaries = [r.finished.speculation for r in runs]
        assert all(s.method == DRAFT_MODEL for s in summaries)
        rates.append(sum(s.accepted for s in summaries) / sum(s.drafted for s in summaries))
    assert rates[0] > 0.8 and rates[1] < rates[0]


def test_a_draft_model_with_another_tokenizer_is_refused_by_name(tiny):
    class Other:
        def get_vocab(self):
            return {f"piece{i}": i for i in range(100)}

    with pytest.raises(
        TokenizerMismatch, match="draft model small does not share the tokenizer of tiny"
    ):
        check_same_tokenizer(Other(), tiny.tokenizer, "small", "tiny")


def test_a_hybrid_model_does_not_speculate(tmp_path, caplog):
    from tests.hybrid_models import build_hybrid_model

    hybrid = load_model(str(build_hybrid_model("qwen3_next", tmp_path / "hybrid")))
    with caplog.at_level("INFO"):
        engine = MLXEngine(hybrid, None, EngineConfig(speculation=SpeculationConfig()))
    assert engine.speculation is None
    assert "cannot be taken back" in caplog.text
    with pytest.raises(ValueError, match="only plain attention models can draft"):
        DraftModel(hybrid.model, "hybrid")
