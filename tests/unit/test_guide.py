"""docs/guide.md cannot go stale: its settings tables match Settings, config/omlx.toml and
the ``omlx serve`` flags, and it names every OMLX_* variable the code reads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import msgspec
import pytest

from omlx.app.cli import serve
from omlx.app.settings import Settings, default_config_text, load_settings

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide.md"
HEADER = "| key | default | flag | environment | what it does |"
FLAG = re.compile(r"`(--[a-z0-9-]+)")


def _rows() -> dict[str, list[str]]:
    """key -> [default, flag, environment, meaning] from every settings table."""
    rows: dict[str, list[str]] = {}
    in_table = False
    for line in GUIDE.read_text(encoding="utf-8").splitlines():
        if line.strip() == HEADER:
            in_table = True
            continue
        if not in_table or not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= {"-"}:
            continue
        key = cells[0].strip("`")
        assert key not in rows, f"{key} is documented twice"
        rows[key] = cells[1:]
    return rows


ROWS = _rows()
TOML = tomllib.loads(default_config_text())
FIELDS = [f.name for f in msgspec.structs.fields(Settings)]


def test_every_setting_is_documented_once_and_nothing_else() -> None:
    assert sorted(ROWS) == sorted(FIELDS), "the guide's tables and Settings differ"
    assert sorted(TOML) == sorted(FIELDS), "config/omlx.toml and Settings differ"


def test_the_toml_and_the_settings_agree_on_defaults() -> None:
    assert load_settings(env={}) == Settings()


@pytest.mark.parametrize("key", FIELDS)
def test_default_and_environment_variable(key: str) -> None:
    default, _, env, meaning = ROWS[key]
    literal = default.strip("`")
    assert default == f"`{literal}`", f"{key}: write the default as a TOML literal in backticks"
    assert tomllib.loads(f"v = {literal}")["v"] == TOML[key], f"{key}: default"
    assert env == f"`OMLX_{key.upper()}`"
    assert meaning


def test_flags_are_the_serve_command_s() -> None:
    serve_flags = {o for p in serve.params for o in p.opts if o.startswith("--")}
    documented = {f for cells in ROWS.values() for f in FLAG.findall(cells[1])}
    assert documented <= serve_flags, f"not flags of omlx serve: {documented - serve_flags}"
    # Every flag but --config (the file itself) sets a key documented here.
    assert serve_flags - documented == {"--config"}, "omlx serve flags missing from the guide"
    for key, (_, flag, _, _) in ROWS.items():
        assert FLAG.search(flag) or flag == "—", f"{key}: a flag in backticks, or —"


def test_every_environment_variable_the_code_reads_is_named() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    read = set()
    for path in (ROOT / "src" / "omlx").rglob("*.py"):
        read |= set(re.findall(r"\bOMLX_[A-Z][A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8")))
    missing = sorted(v for v in read if f"`{v}`" not in text)
    assert not missing, f"docs/guide.md does not name {missing}"


def test_environment_values_follow_the_guide_s_rules() -> None:
    s = load_settings(
        env={
            "OMLX_MODEL_IDLE_TIMEOUT": "30.5",  # a float, though the TOML writes 0
            "OMLX_PIN_MODELS": "a, b",
            "OMLX_ANSWER_ANY_MODEL": "yes",
            "OMLX_CACHE_ENABLED": "0",
            "OMLX_PORT": "9000",
        }
    )
    assert s.model_idle_timeout == 30.5 and s.pin_models == ("a", "b") and s.port == 9000
    assert s.answer_any_model and not s.cache_enabled
    with pytest.raises(ValueError, match="OMLX_PORT='80x'"):
        load_settings(env={"OMLX_PORT": "80x"})
