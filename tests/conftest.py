"""Shared fixtures: the optimized BLAS before mlx, and the tiny test model."""

from __future__ import annotations

from pathlib import Path

import pytest

from omlx.adapters.mlx.blas import load_optimized_blas

# Must run before any test module imports mlx (DESIGN §5).
load_optimized_blas()

from tests.tiny_model import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny-llama")
