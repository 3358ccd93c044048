"""An unloaded model's memory really leaves the process: RSS falls back after the unload.

The measurement runs in a fresh interpreter, as a server does: in the test process the
heap has been cut up by hundreds of earlier tests, and a model loaded into those
fragments gives back pages that RSS cannot show (CI saw an unload drop of 0.5x the
weights that way, with MLX's own count showing every byte freed).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def rss_bytes() -> int:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def measure_two_cycles(root: str) -> None:
    """Load, serve one request and unload twice; print what each step left (JSON)."""
    from omlx.adapters.mlx.models.blas import load_optimized_blas

    load_optimized_blas()  # before mlx, as the server does; without it this takes 5x longer
    import mlx.core as mx

    from omlx.app.chat.sampling import Sampling
    from omlx.app.settings import load_settings
    from omlx.app.wiring.bootstrap import bootstrap
    from tests.tiny_model import build_tiny_model

    # ~120 MB of float32 weights: large against RSS noise, quick to build and load.
    build_tiny_model(
        Path(root) / "models" / "wide", layers=8, hidden_size=512, intermediate_size=2048
    )
    settings = load_settings(
        env={},
        flags={
            "model_dir": f"{root}/models",
            "paged_ssd_cache_dir": f"{root}/cache",
        },
    )
    container = bootstrap(settings)

    async def one_request() -> None:
        served = await container.pool.acquire("wide")
        g = served.generation
        request = g.build_request(
            g.encode_text("hello " * 200), Sampling(max_tokens=4, temperature=0)
        )
        await g.complete(request)

    cycles = []
    try:
        for _ in range(2):  # the second cycle shows nothing piles up across loads
            asyncio.run(one_request())
            loaded = {"rss": rss_bytes(), "mlx": mx.get_active_memory()}
            assert container.pool.unload("wide", force=True)
            cycles.append(
                {"loaded": loaded, "unloaded": {"rss": rss_bytes(), "mlx": mx.get_active_memory()}}
            )
    finally:
        container.close()
    print(json.dumps(cycles))


def test_unloading_a_model_gives_its_weights_back(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from tests.integration.test_pool_memory import measure_two_cycles as m; m({str(tmp_path)!r})",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    cycles = json.loads(run.stdout.strip().splitlines()[-1])
    weights = (tmp_path / "models" / "wide" / "model.safetensors").stat().st_size
    for c in cycles:
        # MLX's own count: nothing still references the weights once the model is gone.
        assert c["loaded"]["mlx"] - c["unloaded"]["mlx"] > 0.95 * weights, (cycles, weights)
        assert c["unloaded"]["mlx"] < 0.05 * weights, (cycles, weights)
        # And the pages leave the process, not only MLX's books.
        assert c["loaded"]["rss"] - c["unloaded"]["rss"] > 0.8 * weights, (cycles, weights)
    # A model kept alive by the second cycle would add all of its weights.
    assert cycles[1]["unloaded"]["rss"] < cycles[0]["unloaded"]["rss"] + 0.5 * weights, (
        cycles,
        weights,
    )
