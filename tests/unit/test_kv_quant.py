"""The kv_bits / kv_group_size settings: parsed from TOML, env and flags, per model, refused when wrong."""

from __future__ import annotations

import pytest

from omlx.app.settings import load_settings
from omlx.domain.cache.kv_quant import (
    KVQuant,
    kv_quant_of,
    model_override,
    parse_kv_bits,
    resolve_kv_mode,
)


def test_off_is_the_default_and_every_spelling_of_off_is_none() -> None:
    assert load_settings(env={}).kv_quant is None
    for off in ("off", "OFF", "", None, 0, "0"):
        assert parse_kv_bits(off) is None


def test_flags_env_and_toml_give_the_setting(tmp_path) -> None:
    assert load_settings(env={}, flags={"kv_bits": "8"}).kv_quant == KVQuant(8, 64)
    env = {"OMLX_KV_BITS": "4", "OMLX_KV_GROUP_SIZE": "32"}
    assert load_settings(env=env).kv_quant == KVQuant(4, 32)
    config = tmp_path / "omlx.toml"
    config.write_text("kv_bits = 8\nkv_group_size = 128\n")  # a bare integer is accepted
    assert load_settings(config, env={}).kv_quant == KVQuant(8, 128)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"kv_bits": "3"}, "kv_bits"),
        ({"kv_bits": "eight"}, "kv_bits"),
        ({"kv_bits": "8", "kv_group_size": 48}, "kv_group_size"),
    ],
)
def test_impossible_values_fail_at_start_naming_the_key(flags, named) -> None:
    with pytest.raises(ValueError, match=named):
        load_settings(env={}, flags=flags)


def test_a_models_own_setting_wins_over_the_servers() -> None:
    server = KVQuant(8, 64)
    assert model_override({}, server) == server
    assert model_override({"task": "chat"}, None) is None
    assert model_override({"kv_bits": "off"}, server) is None
    assert model_override({"kv_bits": 4}, server) == KVQuant(4, 64)
    assert model_override({"kv_group_size": 32}, server) == KVQuant(8, 32)
    assert model_override({"kv_group_size": 32}, None) is None  # group size alone: still off
    with pytest.raises(ValueError, match="kv_group_size"):
        kv_quant_of(8, "64")


def test_the_setting_is_a_separate_namespace_field_only_when_on() -> None:
    assert KVQuant(8, 64).identity() != KVQuant(4, 64).identity() != KVQuant(8, 32).identity()
    assert KVQuant(8, 64).label == "q8g64"


def test_a_model_folders_omlx_json_sets_its_own_kv_bits(tmp_path) -> None:
    from omlx.app.models.options import kv_quant_for

    folder = tmp_path / "model"
    folder.mkdir()
    assert kv_quant_for(folder, None) is None  # no omlx.json: the server's setting
    (folder / "omlx.json").write_text('{"kv_bits": 4, "kv_group_size": 32}')
    assert kv_quant_for(folder, KVQuant(8, 64)) == KVQuant(4, 32)
    (folder / "omlx.json").write_text('{"kv_bits": 5}')
    with pytest.raises(ValueError, match=r"omlx.json.*kv_bits"):
        kv_quant_for(folder, None)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")
    assert kv_quant_for(gguf, KVQuant(8, 64)) == KVQuant(8, 64)  # a file: the server's


def test_kv_mode_is_auto_by_default_and_auto_is_store_on_the_cpu_exact_on_a_gpu(tmp_path) -> None:
    from omlx.app.models.options import kv_quant_for

    settings = load_settings(env={}, flags={"kv_bits": "8"})
    assert settings.kv_mode == "auto"
    assert resolve_kv_mode("auto", gpu=False) == "store"
    assert resolve_kv_mode("auto", gpu=True) == "exact"
    assert resolve_kv_mode("auto", gpu=True, bits=4) == "store"  # exact-4 costs 14% perplexity
    assert resolve_kv_mode("exact", gpu=False, bits=4) == "exact"  # asked for: as asked
    assert resolve_kv_mode("EXACT", gpu=False) == "exact"
    folder = tmp_path / "model"
    folder.mkdir()
    assert kv_quant_for(folder, settings.kv_quant, settings.kv_mode, gpu=False) == KVQuant(8, 64)
    assert kv_quant_for(folder, settings.kv_quant, settings.kv_mode, gpu=True) == KVQuant(
        8, 64, "exact"
    )
    (folder / "omlx.json").write_text('{"kv_bits": 4}')  # auto at 4 bits: store, even on a GPU
    assert kv_quant_for(folder, settings.kv_quant, settings.kv_mode, gpu=True) == KVQuant(4, 64)


def test_kv_mode_from_flags_env_toml_and_a_models_omlx_json(tmp_path) -> None:
    from omlx.app.models.options import kv_quant_for

    assert load_settings(env={}, flags={"kv_mode": "exact"}).kv_mode == "exact"
    assert load_settings(env={"OMLX_KV_MODE": "store"}).kv_mode == "store"
    config = tmp_path / "omlx.toml"
    config.write_text('kv_bits = 4\nkv_mode = "exact"\n')
    settings = load_settings(config, env={})
    folder = tmp_path / "model"
    folder.mkdir()
    assert kv_quant_for(folder, settings.kv_quant, settings.kv_mode) == KVQuant(4, 64, "exact")
    (folder / "omlx.json").write_text('{"kv_mode": "store"}')
    assert kv_quant_for(folder, settings.kv_quant, settings.kv_mode) == KVQuant(4, 64, "store")
    (folder / "omlx.json").write_text('{"kv_mode": "auto", "kv_bits": 8}')
    assert kv_quant_for(folder, None, "store", gpu=True) == KVQuant(8, 64, "exact")
    (folder / "omlx.json").write_text('{"kv_mode": "fast"}')
    with pytest.raises(ValueError, match=r"omlx.json.*kv_mode"):
        kv_quant_for(folder, settings.kv_quant, settings.kv_mode)
    with pytest.raises(ValueError, match="kv_mode"):
        load_settings(env={}, flags={"kv_mode": "fast"})


def test_exact_and_store_are_separate_namespaces_and_store_keeps_its_digest() -> None:
    store, exact = KVQuant(8, 64), KVQuant(8, 64, "exact")
    assert store.identity() != exact.identity()
    # The digest store mode had before kv_mode existed: existing caches stay valid.
    assert store.identity() == {"bits": 8, "group_size": 64, "mode": "store"}
    assert (store.label, exact.label) == ("q8g64", "q8g64-exact")
    with pytest.raises(ValueError, match="kv_mode"):
        KVQuant(8, 64, "auto")  # resolved before it becomes a setting
