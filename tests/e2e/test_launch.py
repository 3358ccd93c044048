"""``omlx launch`` with the real agent CLIs (npm, in ``.agents/``) and the agent test model.

Each run has a fresh HOME, so the server it starts keeps its cache, its log and the agents'
private config under that HOME's ``.omlx``, and no user configuration reaches the agents.
The CLIs are found in the checkout's ``.agents/node_modules/.bin`` (not on PATH here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from omlx.app.launch.local_server import probe
from tests.agent_model import MODEL_ID, REPLY
from tests.e2e.agent_cli import failed_requests
from tests.server_process import free_port


def _launch(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, Path]:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir(exist_ok=True)
    project.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "DISABLE_AUTOUPDATER": "1"}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "omlx", "launch", *argv],
        cwd=project,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, home / ".omlx"


def _started(agent_clis, agent_model_dir, tmp_path, *agent_argv: str) -> tuple[str, str]:
    """Launch with a server of its own; check the turn's requests and that it stopped."""
    port = free_port()
    done, omlx_home = _launch(
        tmp_path, "--model", str(agent_model_dir), "--port", str(port), *agent_argv
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    log_path = omlx_home / "logs" / f"serve-{port}.log"
    log = log_path.read_text()
    assert f"starting omlx on http://127.0.0.1:{port} (log: {log_path})" in done.stderr
    assert not failed_requests(log) and "Application shutdown complete" in log  # a clean stop
    assert probe(f"http://127.0.0.1:{port}") is None  # nothing listens there any more
    assert list((omlx_home / "cache").rglob("*.safetensors"))  # the turn's blocks kept
    return done.stdout, log


def test_launch_claude_runs_a_turn_on_a_server_it_starts_and_stops(
    agent_clis, agent_model_dir, tmp_path
):
    out, log = _started(
        agent_clis, agent_model_dir, tmp_path,
        "claude", "-p", "What does this project do?", "--output-format", "json",
    )  # fmt: skip
    result = json.loads(out)
    assert result["result"] == REPLY and result["is_error"] is False
    assert result["modelUsage"][MODEL_ID]["contextWindow"] == 65536  # the served model's
    assert "POST /v1/messages?beta=true" in log


@pytest.mark.slow  # a real CLI's turn each (the default run keeps claude's)
def test_launch_codex_exec_runs_a_turn_with_its_config_private(
    agent_clis, agent_model_dir, tmp_path
):
    out, log = _started(
        agent_clis, agent_model_dir, tmp_path,
        "codex", "exec", "--skip-git-repo-check", "What does this project do?",
    )  # fmt: skip
    assert out.strip() == REPLY
    assert "POST /v1/responses" in log
    home = tmp_path / "home"
    assert (home / ".omlx" / "agents" / "codex" / "config.toml").exists()
    assert not (home / ".codex").exists()  # the user's Codex folder is never made or read


@pytest.mark.slow  # a real CLI's turn each (the default run keeps claude's)
def test_launch_opencode_run_runs_a_turn(agent_clis, agent_model_dir, tmp_path):
    out, log = _started(
        agent_clis, agent_model_dir, tmp_path, "opencode", "run", "What does this project do?"
    )
    assert out.strip() == REPLY
    assert "POST /v1/chat/completions" in log
    assert not (tmp_path / "home" / ".config" / "opencode" / "opencode.json").exists()


def test_launch_uses_the_omlx_already_on_the_port_and_leaves_it_running(
    agent_clis, agent_server, tmp_path
):
    before = agent_server.read_log().count("POST /v1/messages")
    done, omlx_home = _launch(
        tmp_path, "--port", str(agent_server.port), "--no-cache",
        "claude", "-p", "What does this project do?",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert done.stdout.strip() == REPLY
    assert f"using the omlx already on {agent_server.base_url}; ignored: --no-cache" in done.stderr
    assert not (omlx_home / "logs").exists()  # nothing started
    assert agent_server.read_log().count("POST /v1/messages") > before
    assert httpx.get(agent_server.base_url + "/health", timeout=5).json()["ready"] is True
