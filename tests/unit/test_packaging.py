"""pyproject's hand-kept package list ships every package of the source tree (STYLE 14)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_source_package_is_listed() -> None:
    listed = set(_setuptools()["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT / "src").parts)
        for init in (ROOT / "src" / "omlx").rglob("__init__.py")
    }
    assert on_disk - listed == set(), (
        "packages missing from pyproject's list: a wheel would lack them"
    )
    ours = {p for p in listed if not p.startswith("omlx._")}
    assert ours - on_disk == set(), "pyproject lists packages that no longer exist"


def test_migrations_and_config_ship_as_package_data() -> None:
    tool = _setuptools()
    dirs, data = tool["package-dir"], tool["package-data"]
    assert dirs["omlx._migrations"] == "migrations" and dirs["omlx._config"] == "config"
    for package, folder in (("omlx._migrations", "migrations"), ("omlx._config", "config")):
        assert (ROOT / folder / "__init__.py").is_file()
        assert package in tool["packages"]
        for pattern in data[package]:
            assert list((ROOT / folder).glob(pattern)), f"{package}: {pattern} matches nothing"
    assert list((ROOT / "migrations" / "versions").glob("*.py"))
    assert "omlx._migrations.versions" in tool["packages"]
