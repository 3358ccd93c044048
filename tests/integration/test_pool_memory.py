"""An unloaded model's memory really leaves the process: RSS falls back after the unload."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from omlx.app.bootstrap import bootstrap
from omlx.app.sampling import Sampling
from omlx.app.settings import load_settings
from tests.tiny_model import build_tiny_model


def rss_bytes() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_unloading_a_model_gives_its_weights_back(tmp_path):
    # ~120 MB of float32 weights: large against RSS noise, quick to build and load.
    build_tiny_model(tmp_path / "models" / "wide", layers=8, hidden_size=512, intermediate_size=2048)
    weights = (tmp_path / "models" / "wide" / "model.safetensors").stat().st_size
    settings = load_settings(env={}, flags={
        "model_dir": str(tmp_path / "models"), "paged_ssd_cache_dir": str(tmp_path / "cache"),
    })
    container = bootstrap(settings)
    try:
        async def one_request() -> None:
            served = await container.pool.acquire("wide")
            g = served.generation
            request = g.build_request(g.encode_text("hello " * 200), Sampling(max_tokens=4, temperature=0))
            await g.complete(request)

        samples = []
        for _ in range(2):  # the second cycle shows nothing piles up across loads
            asyncio.run(one_request())
            loaded = rss_bytes()
            assert container.pool.unload("wide", force=True)
            samples.append((loaded, rss_bytes()))
        for loaded, unloaded in samples:
            assert loaded - unloaded > 0.8 * weights, (samples, weights)
        # A model kept alive by the second cycle would add all of its weights; the heap's
        # own growth after other tests in this process reached ~0.5x of them once.
        assert samples[1][1] < samples[0][1] + 0.7 * weights, (samples, weights)
    finally:
        container.close()
