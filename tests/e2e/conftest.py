"""Servers shared by the end-to-end tests: the tiny model, the scripted model, the default model."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_model import build_agent_model
from tests.proxies import proxy_kind  # noqa: F401 - the fixture: each proxy, skipped where missing
from tests.scripted_model import build_scripted_model
from tests.server_process import ServerProcess

API_KEY = "test-key-0123"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def agent_clis() -> Path:
    """The folder of the real ``claude``, ``codex`` and ``opencode`` executables (npm),
    installed into ``.agents/`` on first use by ``scripts/install-agents.sh``."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip(
            "node and npm are needed to install and run the agent CLIs (Claude Code, Codex)"
        )
    done = subprocess.run(
        [str(ROOT / "scripts" / "install-agents.sh")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"installing the agent CLIs failed:\n{done.stdout}\n{done.stderr}"
    return ROOT / ".agents" / "node_modules" / ".bin"


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("tiny-server")
    server = ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-size",
        "16",
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )
    with server:
        yield server


@pytest.fixture(scope="session")
def scripted_model_dir(tmp_path_factory) -> Path:
    return build_scripted_model(tmp_path_factory.mktemp("scripted-model") / "scripted")


@pytest.fixture(scope="session")
def scripted_server(scripted_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    """The scripted model (tool calls and thinking on cue) behind an API key."""
    work = tmp_path_factory.mktemp("scripted-server")
    server = ServerProcess(
        "--model",
        str(scripted_model_dir),
        "--block-size",
        "16",
        "--api-key",
        API_KEY,
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )
    with server:
        yield server


@pytest.fixture(scope="session")
def default_server(tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("default-server")
    server = ServerProcess(cache_dir=work / "cache", log_path=work / "server.log")
    with server:
        yield server


@pytest.fixture(scope="session")
def agent_model_dir(tmp_path_factory) -> Path:
    return build_agent_model(tmp_path_factory.mktemp("agent-model") / "agent")


@pytest.fixture(scope="session")
def agent_server(agent_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    """The agent model (long context, tools in its template, short answers), debug log."""
    work = tmp_path_factory.mktemp("agent-server")
    server = ServerProcess(
        "--model",
        str(agent_model_dir),
        "--log-level",
        "debug",
        cache_dir=work / "cache",
        log_path=work / "server.log",
    )
    with server:
        yield server


@pytest.fixture(scope="session")
def all_tasks_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """A chat model ("chat"), an embedding model ("emb") and a reranker ("rr"): every route
    has a model to reach (the API fuzzing and the hostile-client tests)."""
    from tests.encoder_models import build_embedding_model, build_rerank_model
    from tests.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("all-tasks")
    build_tiny_model(root / "models" / "chat", seed=1)
    build_embedding_model(root / "models" / "emb")
    build_rerank_model(root / "models" / "rr")
    server = ServerProcess(
        "--model-dir",
        str(root / "models"),
        "--block-size",
        "16",
        "--pin-model",
        "chat",
        cache_dir=root / "cache",
        log_path=root / "server.log",
    )
    with server:
        yield server
