"""Prompt normalizations, sealed reasoning and model names: the small rules around a prompt."""

from __future__ import annotations

import os
import threading

import pytest

from omlx.app.chat import sealing
from omlx.app.chat.normalize import RULE_NAMES, PromptNormalizer
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.errors import NotFound
from omlx.app.models.model_names import ModelNames
from omlx.app.settings import load_settings

HEADER = "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch=7f3a1;"


def test_the_billing_header_block_is_dropped_and_counted():
    n = PromptNormalizer()
    assert n.system_blocks([HEADER, "You are Claude Code.", "Be terse."]) == [
        "You are Claude Code.",
        "Be terse.",
    ]
    assert n.applied() == {"claude_code_billing_header": 1}


def test_a_header_line_leading_a_longer_block_goes_alone():
    n = PromptNormalizer()
    assert n.system_blocks([HEADER + "\nYou are Claude Code."]) == ["You are Claude Code."]


def test_the_match_is_anchored_and_other_text_untouched():
    n = PromptNormalizer()
    blocks = ["Quote: x-anthropic-billing-header: cch=1;", " " + HEADER]
    assert n.system_blocks(blocks) == blocks
    assert n.applied() == {"claude_code_billing_header": 0}


def test_rules_can_be_turned_off_and_unknown_ones_are_refused():
    assert PromptNormalizer([]).system_blocks([HEADER]) == [HEADER]
    with pytest.raises(ValueError, match="unknown prompt normalization"):
        PromptNormalizer(["no_such_rule"])
    assert load_settings(env={}).prompt_normalizations == RULE_NAMES
    assert load_settings(env={"OMLX_PROMPT_NORMALIZATIONS": ""}).prompt_normalizations == ()
    with pytest.raises(ValueError, match="no_such_rule"):
        load_settings(flags={"prompt_normalizations": ["no_such_rule"]})


def test_sealed_reasoning_opens_to_the_same_text_and_nothing_else(tmp_path):
    seal = ReasoningSeal.for_folder(tmp_path)
    token = seal.seal("Let me think. ☕")
    assert "think" not in token  # opaque
    assert seal.open(token) == "Let me think. ☕"
    # the key is kept in the folder: another process (a restart) opens it too
    assert ReasoningSeal.for_folder(tmp_path).open(token) == "Let me think. ☕"
    assert oct(os.stat(tmp_path / "reasoning.key").st_mode & 0o777) == "0o600"
    head, nonce, cipher, tag = token.split(".")
    # the first character: all six of its bits are data (the last one may carry padding)
    flipped = ("A" if cipher[0] != "A" else "B") + cipher[1:]
    for bad in (".".join((head, nonce, flipped, tag)), "EqoKCAgQ...", "", None, token + "x"):
        assert seal.open(bad) is None
    assert ReasoningSeal.for_folder(None).open(token) is None  # another key


def test_a_key_file_a_peer_has_just_created_is_read_once_written(tmp_path):
    # Two servers on one shared folder start together: the first creates reasoning.key and
    # writes the key a moment later; the second must wait for it, not fail on an empty file.
    path = tmp_path / "reasoning.key"
    path.touch(mode=0o600)
    key = os.urandom(32)
    writer = threading.Timer(0.05, path.write_bytes, args=(key,))
    writer.start()
    seal = ReasoningSeal.for_folder(tmp_path)
    writer.join()
    assert seal.open(ReasoningSeal(key).seal("same key")) == "same key"


def test_a_key_file_left_empty_is_named_at_start(tmp_path, monkeypatch):
    monkeypatch.setattr(sealing, "_WHOLE_KEY_WAIT_S", 0.05)
    (tmp_path / "reasoning.key").touch()
    with pytest.raises(ValueError, match=r"reasoning\.key holds 0 bytes"):
        ReasoningSeal.for_folder(tmp_path)


def test_names_resolve_to_served_models_through_aliases():
    names = ModelNames(["smol"], ["claude-*", "gpt-4o=smol"])
    assert names.resolve("smol") == "smol"
    assert names.resolve("claude-opus-5-5") == "smol"
    assert names.resolve("gpt-4o") == "smol"
    with pytest.raises(NotFound, match="gpt-5"):
        names.resolve("gpt-5")
    assert names.aliases_of("smol") == ["claude-*", "gpt-4o"]
    assert ModelNames(["smol"], answer_any_model=True).resolve("anything") == "smol"


def test_a_bare_alias_means_the_default_model_when_several_are_served():
    names = ModelNames(["a", "emb", "b"], ["claude-*"], default="a")
    assert names.resolve("claude-sonnet-4") == "a" and names.resolve("b") == "b"


def test_bad_aliases_are_refused_at_start():
    with pytest.raises(ValueError, match="not served"):
        ModelNames(["smol"], ["claude-*=other"])
    with pytest.raises(ValueError, match="several"):
        ModelNames(["a", "b"], ["claude-*"])
    with pytest.raises(ValueError, match="exactly one"):
        ModelNames(["a", "b"], answer_any_model=True)
    assert load_settings(env={"OMLX_MODEL_ALIASES": "a=x, b=y"}).model_aliases == ("a=x", "b=y")
