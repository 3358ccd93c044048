"""Newcomers' mistakes get one line that says what to do: a wrong base URL, a misspelt or
misplaced settings key, an alias flag, a port in use (issue 27)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.app.models.model_names import ModelNames
from omlx.app.server import PortUnavailable, bind_listener
from omlx.app.settings import load_settings
from tests.unit.api_fakes import fake_container


def test_a_doubled_v1_on_the_anthropic_path_says_drop_it_in_anthropics_envelope():
    with TestClient(create_app(fake_container())) as c:
        wrong = c.post("/v1/v1/messages", json={})
    assert wrong.status_code == 404
    body = wrong.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "did you mean /v1/messages?" in body["error"]["message"]
    assert "Drop /v1" in body["error"]["message"]


def test_a_missing_v1_says_add_it():
    with TestClient(create_app(fake_container())) as c:
        openai = c.post("/chat/completions", json={})
        anthropic = c.post("/messages", json={})
        elsewhere = c.get("/nowhere")
    assert openai.status_code == 404
    assert "did you mean /v1/chat/completions? Add /v1" in openai.json()["error"]["message"]
    assert anthropic.json()["type"] == "error"
    assert "did you mean /v1/messages?" in anthropic.json()["error"]["message"]
    assert elsewhere.json()["error"]["message"] == "no route GET /nowhere"


def test_an_alias_flag_adds_to_the_default_claude_alias():
    settings = load_settings(env={}, added_aliases=["gpt-4o=smol"])
    assert settings.model_aliases == ("gpt-4o=smol", "claude-*")
    names = ModelNames(["smol"], settings.model_aliases)
    assert names.resolve("gpt-4o") == names.resolve("claude-sonnet-4-5") == "smol"


def test_an_alias_flag_of_the_same_name_replaces_that_alias_only():
    settings = load_settings(env={}, added_aliases=["claude-*=b"])
    assert settings.model_aliases == ("claude-*=b",)
    names = ModelNames(["a", "b"], settings.model_aliases, default="a")
    assert names.resolve("claude-haiku-4-5") == "b"


def test_a_config_file_can_still_drop_every_alias(tmp_path: Path):
    config = tmp_path / "omlx.toml"
    config.write_text("model_aliases = []\n")
    assert load_settings(config, env={}).model_aliases == ()


def _config_error(tmp_path: Path, text: str) -> str:
    config = tmp_path / "mine.toml"
    config.write_text(text)
    with pytest.raises(ValueError) as caught:
        load_settings(config, env={})
    message = str(caught.value)
    assert message.startswith(f"{config}: ") and "\n" not in message and "$." not in message
    return message


def test_a_misspelt_key_names_the_file_and_the_nearest_key(tmp_path: Path):
    assert "unknown setting 'prot' (did you mean 'port'?)" in _config_error(
        tmp_path, "prot = 9000\n"
    )
    assert "(did you mean 'block_size'?)" in _config_error(tmp_path, "block-size = 32\n")


def test_a_server_section_says_settings_are_top_level_keys(tmp_path: Path):
    message = _config_error(tmp_path, "[server]\nport = 9000\nhost = '0.0.0.0'\n")
    assert "not a [server] section" in message and "(port, host)" in message


def test_a_wrong_type_says_what_was_expected_without_msgspec_paths(tmp_path: Path):
    message = _config_error(tmp_path, 'port = "80a"\n')
    assert message.endswith('port = "80a": expected a whole number, not a string in quotes')


def test_bad_toml_and_bad_values_name_the_file(tmp_path: Path):
    assert "not valid TOML" in _config_error(tmp_path, "port 9000\n")
    assert "block_size must be between" in _config_error(tmp_path, "block_size = 0\n")
    assert "hot_cache_max_size: bad size" in _config_error(
        tmp_path, 'hot_cache_max_size = "lots"\n'
    )


def test_environment_and_flag_mistakes_name_the_variable_or_flag():
    with pytest.raises(ValueError, match=r"^OMLX_PORT='x': expected a whole number$"):
        load_settings(env={"OMLX_PORT": "x"})
    with pytest.raises(ValueError, match=r"^--block-size: block_size must be"):
        load_settings(env={}, flags={"block_size": 0})


def test_a_port_in_use_is_one_line_naming_the_port_and_the_flag():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(PortUnavailable) as caught:
            bind_listener("127.0.0.1", port)
    assert str(caught.value).startswith(f"port {port} on 127.0.0.1 is already in use")
    assert "--port" in str(caught.value)
    free = bind_listener("127.0.0.1", 0)
    free.close()


def test_the_models_sampling_defaults_fill_what_a_request_leaves_out():
    from omlx.app.chat.sampling import Sampling, sampling_params

    defaults = {"temperature": 0.0, "top_p": 0.8, "repetition_penalty": 1.2}
    left_out = sampling_params(Sampling(), 100, defaults)
    assert (left_out.temperature, left_out.top_p, left_out.penalties.repetition) == (0.0, 0.8, 1.2)
    sent = sampling_params(Sampling(temperature=0.7, top_p=1.0), 100, defaults)
    assert (sent.temperature, sent.top_p) == (0.7, 1.0)
    assert sampling_params(Sampling(), 100).temperature == 1.0  # no defaults: OpenAI's


def test_generation_config_json_gives_the_sampling_keys(tmp_path: Path):
    from omlx.adapters.mlx.models.generation_config import read_generation_config

    assert read_generation_config(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text(
        '{"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 2}'
    )
    assert read_generation_config(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (tmp_path / "generation_config.json").write_text('{"do_sample": false, "temperature": 0.6}')
    assert read_generation_config(tmp_path) == {"temperature": 0.0}


def test_the_reference_blas_is_a_warning_an_optimized_one_info(monkeypatch, caplog):
    import logging
    import sys

    from omlx.adapters.mlx.models import blas

    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(blas, "_loaded", None)
    with caplog.at_level(logging.INFO, logger=blas.log.name):
        blas.log_blas()
        monkeypatch.setattr(blas, "_loaded", "/usr/lib/libopenblas.so.0")
        blas.log_blas()
    assert [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records] == [
        ("WARNING", "BLAS: mlx's bundled reference BLAS"),
        ("INFO", "BLAS: optimized"),
    ]


def test_configure_logging_routes_uvicorn_and_quiets_alembic():
    import logging

    from omlx.app.ops.logs import configure_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("info")
        assert logging.getLogger("alembic").getEffectiveLevel() == logging.WARNING
        assert (
            logging.getLogger("uvicorn.error").propagate
            and not logging.getLogger("uvicorn.error").handlers
        )
        configure_logging("debug")
        assert logging.getLogger("alembic").getEffectiveLevel() == logging.DEBUG
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        logging.getLogger("alembic").setLevel(logging.NOTSET)
