"""The server sizes each model's hot tier at load when ``hot_cache_max_size`` is auto."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from omlx.app.settings import load_settings
from omlx.app.wiring.bootstrap import bootstrap
from omlx.domain.tier_defaults import auto_hot_tier_bytes
from tests.tiny_model import build_tiny_model

GB = 10**9


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"kv_memory_limit": "3GB"}, lambda per_token: auto_hot_tier_bytes(per_token, 3 * GB)),
        ({"kv_memory_limit": "3GB", "hot_cache_max_size": "64MB"}, lambda per_token: 64 * 10**6),
    ],
    ids=["auto", "a size"],
)
def test_the_hot_tier_of_a_loaded_model(tmp_path: Path, caplog, flags, expected) -> None:
    build_tiny_model(tmp_path / "models" / "tiny")
    settings = load_settings(
        env={},
        flags={
            "model_dir": str(tmp_path / "models"),
            "paged_ssd_cache_dir": str(tmp_path / "cache"),
            **flags,
        },
    )
    with caplog.at_level(logging.INFO, logger="omlx.app.wiring.model_loader"):
        container = bootstrap(settings)
        served = asyncio.run(container.pool.acquire("tiny"))
    try:
        per_token = served.model.kv_cost.per_token
        hot = served.prefix_cache.stats().hot
        assert hot.max_bytes == expected(per_token)
        line = next(
            r.getMessage() for r in caplog.records if "prefix cache of tiny" in r.getMessage()
        )
        if "hot_cache_max_size" in flags:
            assert "hot tier 64MB" in line
        else:  # 131,072 tokens of the tiny model are far under the 1.5 GB cap: the floor
            assert hot.max_bytes == 1.5 * GB and "hot tier auto: 1.5 GB" in line, line
    finally:
        container.close()
