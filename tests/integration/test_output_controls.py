"""The engine's output controls against mlx-lm itself: logprobs, penalties, min_p, logit
bias, and a grammar-constrained row batched beside a free one."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

from omlx.adapters.grammar import LLGuidanceCompiler
from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.models.loader import load_model
from omlx.domain.generation import (
    GenerationRequest,
    Penalties,
    ReasoningBudget,
    SamplingParams,
    TextDelta,
)
from omlx.domain.grammar import OutputGrammar
from tests.engine_helpers import generate, submit

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["n", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


@pytest.fixture(scope="module")
def grammars(tiny):
    return LLGuidanceCompiler(
        tiny.tokenizer, sorted(tiny.tokenizer.eos_token_ids), tiny.config["vocab_size"]
    )


@pytest.fixture()
def engine(tiny):
    engine = MLXEngine(tiny, None, EngineConfig(max_concurrent=4, prefill_step_size=32))
    engine.start()
    yield engine
    engine.stop()


def prompt_of(model, text: str) -> list[int]:
    return model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )


def reference(model, prompt: list[int], n: int, **kwargs) -> list[tuple[int, mx.array]]:
    """mlx-lm's own tokens and log-probability rows for the prompt, up to end-of-sequence."""
    out = []
    for token, logprobs in generate_step(mx.array(prompt), model.model, max_tokens=n, **kwargs):
        if int(token) in model.tokenizer.eos_token_ids:
            break
        out.append((int(token), logprobs))
    return out


def entries(run) -> list:
    return [e for ev in run.events if isinstance(ev, TextDelta) for e in ev.logprobs]


def greedy(prompt, n, **fields) -> GenerationRequest:
    return GenerationRequest(tuple(prompt), n, SamplingParams(temperature=0.0), **fields)


def test_logprobs_are_mlx_lms_one_entry_per_token(tiny, engine):
    prompt = prompt_of(tiny, "What is the capital of France?")
    expected = reference(tiny, prompt, 20)
    run = generate(engine, greedy(prompt, 20, logprobs=5))
    got = entries(run)
    assert len(got) == run.finished.completion_tokens == len(expected)
    for entry, (token, row) in zip(got, expected, strict=True):
        assert entry.token == token
        assert entry.logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert len(entry.top) == 5
        best = sorted(row.tolist(), reverse=True)[:5]
        assert [v for _, v in entry.top] == pytest.approx(best, abs=1e-4)
        assert entry.top[0][0] == token  # greedy: the chosen token is the most likely


def test_logprobs_zero_reports_only_the_chosen_token(tiny, engine):
    run = generate(engine, greedy(prompt_of(tiny, "hello"), 8, logprobs=0))
    got = entries(run)
    assert len(got) == run.finished.completion_tokens and all(e.top == () for e in got)
    assert entries(generate(engine, greedy(prompt_of(tiny, "hello"), 8))) == []


def test_penalties_are_mlx_lms(tiny, engine):
    """Same tokens and same penalized log-probabilities as mlx-lm's processors give."""
    prompt = prompt_of(tiny, "Repeat after me: the the the the")
    penalties = Penalties(repetition=1.5, presence=0.5, frequency=0.3)
    processors = make_logits_processors(
        repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3
    )
    expected = reference(tiny, prompt, 24, logits_processors=processors)
    plain = reference(tiny, prompt, 24)
    request = GenerationRequest(
        tuple(prompt), 24, SamplingParams(temperature=0.0, penalties=penalties), logprobs=0
    )
    got = entries(generate(engine, request))
    assert [e.token for e in got] == [t for t, _ in expected]
    assert [e.logprob for e in got] == pytest.approx([r[t].item() for t, r in expected], abs=1e-4)
    # The penalties change these values: the test would tell if they were ignored.
    assert [e.logprob for e in got] != pytest.approx([r[t].item() for t, r in plain], abs=1e-3)


def test_logit_bias_forces_a_token(tiny, engine):
    token = tiny.tokenizer.encode(" fox", add_special_tokens=False)[0]
    bias = Penalties(logit_bias=((token, 100.0),))
    request = GenerationRequest(
        tuple(prompt_of(tiny, "hi")), 6, SamplingParams(1.0, seed=3, penalties=bias), logprobs=0
    )
    assert [e.token for e in entries(generate(engine, request))] == [token] * 6


def test_min_p_one_keeps_only_the_best_token(tiny, engine):
    prompt = prompt_of(tiny, "Tell me a story")
    greedy_text = generate(engine, greedy(prompt, 16)).text
    for seed in (1, 2):
        request = GenerationRequest(tuple(prompt), 16, SamplingParams(1.0, seed=seed, min_p=1.0))
        assert generate(engine, request).text == greedy_text
    free = {
        generate(engine, GenerationRequest(tuple(prompt), 16, SamplingParams(1.0, seed=s))).text
        for s in (1, 2, 3)
    }
    assert free != {greedy_text}  # without min_p, sampling differs: the test can tell


def test_a_constrained_and_a_free_row_in_one_batch_each_produce_their_solo_text(
    tiny, engine, grammars
):
    grammar = OutputGrammar(json_schema=json.dumps(SCHEMA))
    prompts = [prompt_of(tiny, "Give me JSON"), prompt_of(tiny, "Say something " * 3)]

    def requests():
        return [
            greedy(prompts[0], 24, constraint=grammars.constraint(grammar)),
            greedy(prompts[1], 24),
        ]

    solo = [generate(engine, r).text for r in requests()]
    assert solo[0].startswith('{"n": ')
    assert not solo[1].startswith('{"n": ')
    runs = [submit(engine, r) for r in requests()]
    for run in runs:
        assert run.done.wait(120)
    assert [r.text for r in runs] == solo


def test_a_finished_grammar_ends_the_row_with_end_of_sequence(tiny, engine, grammars):
    schema = {"enum": ["yes", "no"]}
    request = greedy(
        prompt_of(tiny, "Answer"),
        30,
        constraint=grammars.constraint(OutputGrammar(json_schema=json.dumps(schema))),
    )
    run = generate(engine, request)
    assert json.loads(run.text) in ("yes", "no")
    assert run.finished.reason == "stop" and run.finished.completion_tokens < 30


def test_a_spent_reasoning_budget_forces_the_end_marker(tiny, engine):
    """The tiny model has no reasoning markers: two tokens it never writes here stand in."""
    prompt = prompt_of(tiny, "Think about it")
    free = [e.token for e in entries(generate(engine, greedy(prompt, 12, logprobs=0)))]
    unused = [
        t
        for t in range(3, len(tiny.tokenizer))
        if t not in free and t not in tiny.tokenizer.eos_token_ids
    ]
    end = (unused[0], unused[1])
    budget = ReasoningBudget(3, start=(unused[2],), end=end, opened=True)
    got = [
        e.token
        for e in entries(generate(engine, greedy(prompt, 12, logprobs=0, reasoning_budget=budget)))
    ]
    assert got[:3] == free[:3] and tuple(got[3:5]) == end
    # Not yet opened: the budget counts only once the start marker is written.
    closed = ReasoningBudget(3, start=(unused[2],), end=end, opened=False)
    assert [
        e.token
        for e in entries(generate(engine, greedy(prompt, 12, logprobs=0, reasoning_budget=closed)))
    ] == free
