"""Speculation's settings: on by default, --no-speculation, --draft-model, a model's omlx.json."""

from __future__ import annotations

import json

import pytest

from omlx.app.models.options import speculation_for
from omlx.app.settings import load_settings


def test_on_by_default_off_by_flag_or_environment() -> None:
    assert load_settings(env={}).speculation is True
    assert load_settings(env={}, flags={"speculation": False}).speculation is False
    assert load_settings(env={"OMLX_SPECULATION": "false"}).speculation is False
    settings = load_settings(env={}, flags={"draft_model": "/models/small"})
    assert settings.draft_model == "/models/small"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"speculation_max_draft": 0}, "speculation_max_draft"),
        ({"speculation_max_rows": 0}, "speculation_max_rows"),
    ],
)
def test_impossible_values_fail_at_start_naming_the_key(flags, named) -> None:
    with pytest.raises(ValueError, match=named):
        load_settings(env={}, flags=flags)


def test_a_models_omlx_json_wins_over_the_servers(tmp_path) -> None:
    settings = load_settings(env={})
    folder = tmp_path / "model"
    folder.mkdir()
    assert speculation_for(folder, settings) == (True, "")
    (folder / "omlx.json").write_text(json.dumps({"speculation": False}))
    assert speculation_for(folder, settings) == (False, "")
    (folder / "omlx.json").write_text(json.dumps({"draft_model": "small"}))
    assert speculation_for(folder, settings) == (
        True,
        str(folder / "small"),
    )  # relative to the folder
    off = load_settings(env={}, flags={"speculation": False})
    (folder / "omlx.json").write_text(json.dumps({"speculation": True}))
    assert speculation_for(folder, off) == (True, "")
    (folder / "omlx.json").write_text(json.dumps({"speculation": "yes"}))
    with pytest.raises(ValueError, match=r"omlx\.json.*speculation"):
        speculation_for(folder, settings)
