"""What writing blocks costs the request path: a multi-turn chat through a real engine.

    .venv/bin/python bench/store_cost.py [--turns 4]

Prints, per turn, the time from the last text to ``Finished`` (what the client
waits for) and the time the engine then spends cutting and queueing the new
blocks before it reads its next command (``PrefixCache.stats().last_store_seconds``).
The disk writes themselves run on the writer thread and are not counted here.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from omlx.adapters.mlx.blas import load_optimized_blas

load_optimized_blas()

from omlx.app.bootstrap import bootstrap  # noqa: E402
from omlx.app.settings import load_settings  # noqa: E402
from omlx.domain.generation import Finished, GenerationRequest, SamplingParams, TextDelta  # noqa: E402

CONTEXT = Path(__file__).resolve().parents[1] / "src" / "omlx" / "app" / "generation.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        container = bootstrap(load_settings(flags={"paged_ssd_cache_dir": cache_dir}))
        try:
            run(container, args.turns)
        finally:
            container.close()


def run(container, turns: int) -> None:
    model, cache = container.model, container.prefix_cache
    messages = [
        {"role": "system", "content": CONTEXT.read_text()[:3000]},
        {"role": "user", "content": "Summarize this module."},
    ]
    for turn in range(1, turns + 1):
        prompt = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        stamps: dict[str, float] = {}
        text: list[str] = []
        done = threading.Event()

        def emit(event, stamps=stamps, text=text, done=done) -> None:
            now = time.perf_counter()
            if isinstance(event, TextDelta):
                stamps["text"] = now
                text.append(event.text)
            elif isinstance(event, Finished):
                stamps["finished"] = now
                done.set()

        job = container.engine.submit(GenerationRequest(tuple(prompt), 16, SamplingParams(0.0)), emit)
        done.wait()
        while not container.engine.settled(job):
            time.sleep(0.001)
        settled = time.perf_counter()
        stats = cache.stats()
        print(
            f"turn {turn}: prompt {len(prompt)} tokens, restored {stats.hit_tokens} in all; "
            f"last text -> Finished {1000 * (stamps['finished'] - stamps.get('text', stamps['finished'])):.1f} ms; "
            f"then storing blocks {1000 * (settled - stamps['finished']):.1f} ms "
            f"(PrefixCache.store {1000 * stats.last_store_seconds:.1f} ms)"
        )
        messages += [
            {"role": "assistant", "content": "".join(text)},
            {"role": "user", "content": f"Tell me more about part {turn}."},
        ]


if __name__ == "__main__":
    main()
