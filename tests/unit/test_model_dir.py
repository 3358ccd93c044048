"""``--model-dir`` walks (issue 22 row 9): link loops detected, a bad model folder skipped
with a warning, the rest served."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from omlx.app.models.catalog import EMBEDDING, discover


def model(folder: Path, **omlx: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if omlx:
        (folder / "omlx.json").write_text(json.dumps(omlx))
    return folder


def test_links_to_a_parent_are_not_followed_twice(tmp_path, caplog):
    root = tmp_path / "models"
    model(root / "team" / "chat-a")
    (root / "team" / "up").symlink_to("..")
    (root / "team" / "up-again").symlink_to("..")
    (root / "self").symlink_to(".")
    (root / "loop").symlink_to("loop")  # a link to itself: ELOOP
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="omlx"):
        specs = discover(root)
    assert time.monotonic() - started < 2
    assert [s.id for s in specs] == ["chat-a"]
    assert "already searched; not followed" in caplog.text


def test_a_bad_omlx_json_is_skipped_and_the_rest_served(tmp_path, caplog):
    root = tmp_path / "models"
    model(root / "good")
    model(root / "embed", task=EMBEDDING)
    bad = model(root / "bad")
    (bad / "omlx.json").write_text("{not json")
    wrong = model(root / "wrong", task="dance")
    with caplog.at_level(logging.WARNING, logger="omlx"):
        specs = discover(root)
    assert sorted(s.id for s in specs) == ["embed", "good"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert any(str(bad / "omlx.json") in w and "not a JSON object" in w for w in warnings)
    assert any(str(wrong / "omlx.json") in w and "'dance'" in w for w in warnings)


def test_an_unreadable_omlx_json_is_skipped(tmp_path, caplog, monkeypatch):
    """Root reads any file, so the refusal is the one the OS gives other users."""
    root = tmp_path / "models"
    model(root / "good")
    locked = model(root / "locked", task="chat")
    read_text = Path.read_text

    def refuse(self, *args, **kwargs):
        if self == locked / "omlx.json":
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)
    with caplog.at_level(logging.WARNING, logger="omlx"):
        assert [s.id for s in discover(root)] == ["good"]
    assert f"skipped {locked}" in caplog.text and "Permission denied" in caplog.text
