"""What ``omlx launch`` gives each agent CLI, and how its command line splits."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from omlx.app.cli import main
from omlx.app.launch import agent_settings as s
from omlx.app.launch.find_agent import find_agent, missing_line

SERVER = s.Endpoint("http://127.0.0.1:8123", "sk-k", "agent", 65536)


def test_context_limits_leave_the_answer_what_is_above_the_compaction_trigger():
    limits = s.ContextLimits.of(65536)
    assert limits.compact_at == 55705 and limits.output == 65536 - 55705


def test_claude_code_gets_the_base_url_without_v1_a_key_and_every_model_name_pinned():
    setup = s.claude_code_setup(SERVER)
    env = setup.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"
    assert env["ANTHROPIC_API_KEY"] == "sk-k"
    names = [
        "ANTHROPIC_MODEL",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL",
        "ANTHROPIC_DEFAULT_SONNET_MODEL",
        "ANTHROPIC_DEFAULT_OPUS_MODEL",
        "CLAUDE_CODE_SUBAGENT_MODEL",
    ]
    assert {env[n] for n in names} == {"agent"}
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "65536"
    assert env["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == str(s.COMPACT_PERCENT)
    # Claude Code reads an auto-compact window under 100k as 100k: left out for 64k
    assert "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in env
    assert "ANTHROPIC_AUTH_TOKEN" in setup.unset and not setup.files


def test_claude_code_gets_an_auto_compact_window_where_it_can_read_one():
    env = s.claude_code_setup(s.Endpoint("http://h:1", "k", "big", 131072)).env
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "131072"


def test_an_unloaded_model_s_unknown_context_is_left_to_the_agents():
    unknown = s.Endpoint("http://h:1", "k", "m", None)
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in s.claude_code_setup(unknown).env
    assert "model_context_window" not in tomllib.loads(s.codex_config(unknown))
    assert "limit" not in s.opencode_config(unknown)["provider"]["omlx"]["models"]["m"]


def test_codex_gets_a_responses_provider_in_its_own_home(tmp_path):
    setup = s.codex_setup(SERVER, tmp_path / "codex")
    assert setup.env == {"CODEX_HOME": str(tmp_path / "codex"), "OMLX_API_KEY": "sk-k"}
    (path, text), = setup.files.items()  # fmt: skip
    assert path == tmp_path / "codex" / "config.toml"
    config = tomllib.loads(text)
    assert config["model"] == "agent" and config["model_provider"] == "omlx"
    assert config["model_context_window"] == 65536
    assert config["model_auto_compact_token_limit"] == 55705
    assert config["model_providers"]["omlx"] == {
        "name": "omlx",
        "base_url": "http://127.0.0.1:8123/v1",
        "wire_api": "responses",
        "env_key": "OMLX_API_KEY",
    }


def test_codex_s_own_additions_survive_the_next_launch_and_ours_are_replaced():
    first = s.codex_config(SERVER)
    trusted = first + '\n[projects."/src/app"]\ntrust_level = "trusted"\n'
    other = s.Endpoint("http://127.0.0.1:9000", "k", "other", 32768)
    config = tomllib.loads(s.codex_config(other, trusted))
    assert config["model"] == "other" and config["model_context_window"] == 32768
    assert config["model_providers"]["omlx"]["base_url"] == "http://127.0.0.1:9000/v1"
    assert config["projects"] == {"/src/app": {"trust_level": "trusted"}}


def test_opencode_gets_the_provider_and_model_from_a_config_file_of_its_own(tmp_path):
    setup = s.opencode_setup(SERVER, tmp_path)
    assert setup.env == {"OPENCODE_CONFIG": str(tmp_path / "opencode.json")}
    config = json.loads(setup.files[tmp_path / "opencode.json"])
    assert config["model"] == config["small_model"] == "omlx/agent"
    provider = config["provider"]["omlx"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:8123/v1"
    assert provider["options"]["apiKey"] == "sk-k" and provider["options"]["includeUsage"]
    assert provider["models"]["agent"]["limit"] == {"context": 65536, "output": 65536 - 55705}


def test_setup_for_keeps_codex_s_file_between_launches(tmp_path):
    (tmp_path / "config.toml").write_text(s.codex_config(SERVER) + "\n[notice]\nhide = true\n")
    setup = s.setup_for("codex", SERVER, tmp_path)
    assert tomllib.loads(setup.files[tmp_path / "config.toml"])["notice"] == {"hide": True}
    with pytest.raises(ValueError, match="unknown agent"):
        s.setup_for("aider", SERVER, tmp_path)


def _executable(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_an_agent_is_found_on_path_first_then_in_the_checkout(tmp_path):
    codex = s.AGENTS["codex"]
    local = _executable(tmp_path / "local", "codex")
    on_path = _executable(tmp_path / "bin", "codex")
    assert find_agent(codex, str(tmp_path / "bin"), local.parent) == on_path
    assert find_agent(codex, str(tmp_path / "empty"), local.parent) == local
    assert find_agent(codex, str(tmp_path / "empty"), None) is None
    line = missing_line(s.AGENTS["opencode"], None)
    assert line == "opencode not found on PATH; install it with `npm install -g opencode-ai`"


def _plan_of(monkeypatch, *argv: str):
    """The plan ``omlx launch ARGV`` would run, captured instead of run."""
    import omlx.app.launch as launch_package

    plans = []
    monkeypatch.setattr(launch_package, "launch", lambda plan, say: plans.append(plan) or 0)
    done = CliRunner().invoke(main, ["launch", *argv], env={"OMLX_API_KEY": None})
    assert done.exit_code == 0, done.output
    return plans[0]


def test_omlx_options_go_to_the_server_and_everything_after_the_agent_to_the_agent(monkeypatch):
    plan = _plan_of(
        monkeypatch,
        "--model", "/m/a", "--model", "/m/b", "--no-cache", "--port", "9123", "--kv-bits", "8",
        "claude", "-p", "hi there", "--model", "sonnet", "--", "--port",
    )  # fmt: skip
    assert plan.agent == "claude"
    assert plan.agent_args == ("-p", "hi there", "--model", "sonnet", "--", "--port")
    assert plan.port == 9123 and plan.host == "127.0.0.1" and plan.api_key == ""
    assert plan.serve_args == ("--model", "/m/a", "--model", "/m/b", "--no-cache", "--kv-bits", "8")


def test_without_omlx_options_the_server_gets_none_and_the_defaults_stand(monkeypatch):
    plan = _plan_of(monkeypatch, "codex", "exec", "--json", "hello")
    assert plan.serve_args == () and plan.port == 8000
    assert plan.agent_args == ("exec", "--json", "hello")


def test_a_missing_cli_is_one_line_naming_its_npm_package_and_status_127(monkeypatch, tmp_path):
    import omlx.app.launch.command as command

    monkeypatch.setattr(command, "local_bin_dir", lambda: tmp_path / "no-agents")
    done = CliRunner().invoke(
        main, ["launch", "opencode", "run", "hi"], env={"PATH": str(tmp_path / "empty")}
    )
    assert done.exit_code == 127
    assert done.output == (
        f"omlx launch: opencode not found on PATH or in {tmp_path / 'no-agents'}; install it "
        "with `npm install -g opencode-ai` (or scripts/install-agents.sh for this checkout)\n"
    )
