"""Imports point inward (DESIGN §3): the domain reaches no layer above it (its policies
take ports, never adapters), the adapters and the ``omlx.cache`` library never reach up
into the app, the adapters never into the library built on them, and the HTTP edge
(``app/api``) never past the app's services to an adapter. Inside the MLX adapter, rooms
point down: ``batch`` -> ``models`` -> ``cache`` -> ``mlx_lm_private``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "omlx"
# package -> the omlx packages its modules may not import, even lazily inside a function
FORBIDDEN = {
    "domain": ("omlx.adapters", "omlx.app", "omlx.cache"),
    "adapters": ("omlx.app", "omlx.cache"),
    "cache": ("omlx.app",),
    # The HTTP edge calls the app's services; only the composition root builds adapters.
    "app/api": ("omlx.adapters",),
    "adapters/mlx/models": ("omlx.adapters.mlx.batch",),
    "adapters/mlx/cache": ("omlx.adapters.mlx.batch", "omlx.adapters.mlx.models"),
    "adapters/mlx/mlx_lm_private": (
        "omlx.adapters.mlx.batch",
        "omlx.adapters.mlx.models",
        "omlx.adapters.mlx.cache",
    ),
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_nothing_above_it(package: str) -> None:
    modules = sorted((SRC / package).rglob("*.py"))
    assert modules
    wrong = {
        f"{path.relative_to(SRC)}: {name}"
        for path in modules
        for name in _imports(path)
        if name.startswith(FORBIDDEN[package])
    }
    assert not wrong, sorted(wrong)
