"""pyproject.toml's hand-written package list names every package of the source tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_package_is_listed_for_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = {p for p in config["packages"] if not p.startswith("omlx._")}  # mapped folders
    src = ROOT / "src"
    found = {
        ".".join(init.parent.relative_to(src).parts)
        for init in src.glob("omlx/**/__init__.py")
    }
    assert found == listed
