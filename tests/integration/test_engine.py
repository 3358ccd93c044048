"""The engine against mlx-lm itself: same tokens, stop strings, seeds, concurrency."""

from __future__ import annotations

import time

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.batch.fused_prefill import FusingBatchGenerator
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.generation import GenerationRequest, SamplingParams
from tests.engine_helpers import generate, greedy, submit


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


@pytest.fixture()
def engine(tiny):
    engine = MLXEngine(tiny, None, EngineConfig(max_concurrent=4, prefill_step_size=32))
    engine.start()
    yield engine
    engine.stop()


def chat_tokens(model, text: str) -> list[int]:
    return model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )


def reference_tokens(model, prompt: list[int], n: int) -> list[int]:
    out = []
    for token, _ in generate_step(mx.array(prompt), model.model, max_tokens=n):
        out.append(int(token))
        if int(token) in model.tokenizer.eos_token_ids:
            break
    return out


def test_greedy_equals_mlx_lm_token_for_token(tiny, engine):
    prompt = chat_tokens(tiny, "What is the capital of France?")
    expected = reference_tokens(tiny, prompt, 24)
    run = generate(engine, greedy(prompt, 24))
    ids = tiny.tokenizer.encode(run.text, add_special_tokens=False)
    assert run.finished.completion_tokens == len(
        [t for t in expected if t not in tiny.tokenizer.eos_token_ids]
    )
    assert run.text == tiny.tokenizer.decode(
        [t for t in expected if t not in tiny.tokenizer.eos_token_ids]
    )
    assert ids  # the text is not empty


def test_stop_string_cuts_the_text(tiny, engine):
    prompt = chat_tokens(tiny, "Tell me something")
    full = generate(engine, greedy(prompt, 24)).text
    assert len(full) > 6
    stop = full[3:6]
    run = generate(engine, greedy(prompt, 24, stop=(stop,)))
    assert run.finished.reason == "stop"
    assert run.text == full[: full.index(stop)]


def test_seeded_sampling_is_reproducible(tiny, engine):
    prompt = chat_tokens(tiny, "Write a word")
    request = GenerationRequest(
        tuple(prompt), 12, SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    )
    first = generate(engine, request).text
    second = generate(engine, request).text
    assert first == second


def test_concurrent_requests_each_match_their_solo_text(tiny, engine):
    prompts = [chat_tokens(tiny, f"Question number {i}: " + "why? " * (i * 5)) for i in range(4)]
    solo = [generate(engine, greedy(p, 20)).text for p in prompts]
    runs = [submit(engine, greedy(p, 20)) for p in prompts]
    for run in runs:
        assert run.done.wait(120)
    assert [r.text for r in runs] == solo


def test_cancel_frees_the_slot(tiny, engine):
    prompt = chat_tokens(tiny, "A long answer please")
    run = submit(engine, greedy(prompt, 2000))
    while not run.events:
        run.done.wait(0.05)
    job_ids = list(engine._jobs)
    engine.cancel(job_ids[0])
    assert run.done.wait(30)
    assert run.finished.reason == "cancelled"
    assert engine.active == 0


def test_warm_up_runs_to_the_end_and_leaves_the_output_alone(tiny, caplog):
    prompt = chat_tokens(tiny, "What is the capital of France?")
    expected = reference_tokens(tiny, prompt, 12)
    engine = MLXEngine(tiny, None, EngineConfig(warm_up=True))
    with caplog.at_level("INFO", logger="omlx.adapters.mlx.batch.engine"):
        engine.start()
        deadline = time.monotonic() + 60
        while "warmed up" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.01)
        try:
            run = generate(engine, greedy(prompt, 12))
        finally:
            engine.stop()
    eos = tiny.tokenizer.eos_token_ids
    assert run.text == tiny.tokenizer.decode([t for t in expected if t not in eos])


def test_a_request_waiting_at_start_stops_the_warm_up(tiny, caplog):
    """The warm-up is skipped work, not a queue: a request already there goes first."""
    prompt = chat_tokens(tiny, "What is the capital of France?")
    expected = reference_tokens(tiny, prompt, 12)
    engine = MLXEngine(tiny, None, EngineConfig(warm_up=True))
    with caplog.at_level("INFO", logger="omlx.adapters.mlx.batch.engine"):
        run = submit(engine, greedy(prompt, 12))  # in the inbox before the thread starts
        engine.start()
        try:
            assert run.done.wait(60)
        finally:
            engine.stop()
    assert "warm-up stopped for a request" in caplog.text and "warmed up" not in caplog.text
    eos = tiny.tokenizer.eos_token_ids
    assert run.text == tiny.tokenizer.decode([t for t in expected if t not in eos])


class _CountingModel:
    """The model, counting its forward passes."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)


def _first_token_step_and_tokens(
    model, prompt: list[int], fused: bool
) -> tuple[int, int, list[int]]:
    """The step that hands out the first token, the forward passes run by then, the tokens."""
    counting = _CountingModel(model)
    generator = FusingBatchGenerator(counting, fuse=fused, in_order=fused, prefill_step_size=256)
    generator.insert_segments([[prompt]], max_tokens=[8])
    first, passes, tokens = None, None, []
    for step in range(1, 40):
        before = counting.calls
        _, generated = generator.next()
        for r in generated:
            if first is None:
                # In order, this step's pass is only built; mlx-lm's pipelined step ran it.
                first, passes = step, before if fused else counting.calls
            tokens.append(r.token)
        if any(r.finish_reason for r in generated):
            break
    return first, passes, tokens


def test_the_first_token_comes_one_pass_sooner_with_the_same_tokens(tiny):
    """mlx-lm's batcher: prompt chunk, last token alone, then token 1 handed out a pass
    late; fused and in order: the chunk with its last token, then token 1."""
    prompt = chat_tokens(tiny, "What is the capital of France?")
    fused_first, fused_passes, fused_tokens = _first_token_step_and_tokens(
        tiny.model, prompt, fused=True
    )
    plain_first, plain_passes, plain_tokens = _first_token_step_and_tokens(
        tiny.model, prompt, fused=False
    )
    assert (fused_first, plain_first) == (2, 3)
    assert (fused_passes, plain_passes) == (1, 3)
    assert fused_tokens == plain_tokens and len(fused_tokens) == 8


def _tokens_per_row(model, rows, fused: bool, **options) -> tuple[list[list[int]], list[int]]:
    """Each row's generated tokens, run together in one batch, and which rows fused."""
    generator = FusingBatchGenerator(model, fuse=fused, in_order=fused, prefill_step_size=64)
    uids = generator.insert_segments(rows, max_tokens=[6] * len(rows), **options)
    tokens = {uid: [] for uid in uids}
    finished: set[int] = set()
    fused_uids: set[int] = set()
    for _ in range(100):
        started, generated = generator.next()
        fused_uids.update(r.uid for r in started if getattr(r, "fused", False))
        for r in generated:
            tokens[r.uid].append(r.token)
            if r.finish_reason is not None:
                finished.add(r.uid)
        if finished == set(uids):
            break
    assert finished == set(uids) and generator.fused_rows == len(fused_uids)
    return [tokens[uid] for uid in uids], [i for i, uid in enumerate(uids) if uid in fused_uids]


def test_rows_fuse_only_where_every_chunk_of_the_step_is_short_and_the_cut_is_mlx_lms(tiny):
    """A 20-token row beside a 200-token one does not fuse (the step has a 64-token
    chunk); the long one fuses in its own last step; a row whose caller gave its last token
    a segment of its own keeps that boundary. Each row's tokens are mlx-lm's, with a
    repetition penalty on two of them (the fused row's first token is sampled through it)."""
    from mlx_lm.sample_utils import make_logits_processors

    short = chat_tokens(tiny, "Hi")[:20]
    long = chat_tokens(tiny, "Tell me about the sea. " * 20)[:200]
    asked = chat_tokens(tiny, "And the sky?")
    rows = [[short], [long], [asked[:-1], asked[-1:]]]
    penalty = make_logits_processors(repetition_penalty=1.5)
    options = {"logits_processors": [penalty, penalty, []]}
    fused, fused_rows = _tokens_per_row(tiny.model, rows, fused=True, **options)
    plain, plain_rows = _tokens_per_row(tiny.model, rows, fused=False, **options)
    assert (fused_rows, plain_rows) == ([1], [])
    assert fused == plain and all(len(t) > 0 for t in fused)
