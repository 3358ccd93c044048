"""Two sub-agents started together on one long system prompt: the server computes the prefix
once (issue 38). A real server, two official ``openai`` clients in parallel."""

from __future__ import annotations

import random
import threading
import time

import openai
from tokenizers import Tokenizer

from tests.cache_header import checked_header

MODEL = "tiny-llama"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "capital",
    "France",
    "cache",
    "prefix",
    "turn",
]


def system_prompt(seed: int, words: int) -> str:
    """A long system prompt no other test sends (the server is shared by the session)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def shared_tokens(model_dir, system: str) -> int:
    """The prompt tokens both requests start with: the system turn and the user turn's head
    (the tiny model's ChatML template)."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    head = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
    return len(tokenizer.encode(head, add_special_tokens=False).ids)


def test_the_second_of_two_parallel_sub_agents_restores_the_prefix_they_share(
    tiny_server, tiny_model_dir
):
    system = system_prompt(random.randrange(1 << 30), 700)
    shared = shared_tokens(tiny_model_dir, system)
    start = threading.Barrier(2)
    results: dict[str, tuple[float, int, int]] = {}
    reports: dict[str, dict[str, str]] = {}

    def sub_agent(task: str) -> None:
        sdk = openai.OpenAI(base_url=tiny_server.base_url + "/v1", api_key="unused", max_retries=0)
        start.wait()
        began = time.monotonic()
        first = None
        usage = None
        raw = sdk.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": task}],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in raw.parse():
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic() - began
            if chunk.usage is not None:
                usage = chunk.usage
        assert first is not None and usage is not None
        cached = usage.prompt_tokens_details.cached_tokens
        reports[task] = checked_header(raw.headers, cached)  # sent once it had waited
        results[task] = (first, usage.prompt_tokens, cached)

    tasks = ["Explore the tests folder.", "Review the cache code."]
    threads = [threading.Thread(target=sub_agent, args=(t,)) for t in tasks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2, results
    (ttft_a, _, cached_a), (ttft_b, _, cached_b) = sorted(results.values(), key=lambda r: r[2])
    assert shared > 1000
    assert cached_a < 0.5 * shared  # the first computed the prefix...
    assert cached_b >= 0.95 * shared, results  # ...the second restored it
    assert ttft_b <= 1.2 * ttft_a, results
    # Two first turns: new conversations, neither a miss. The second restored the first's
    # prefix after waiting for it: a new conversation past it, or, where the first had not
    # yet kept the block in which the two part, a prefix in flight.
    first_report, second_report = (reports[t] for t in sorted(results, key=lambda t: results[t][2]))
    assert first_report["outcome"] == "new_conversation", reports
    assert second_report["outcome"] in ("new_conversation", "in_flight"), reports
