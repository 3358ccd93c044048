"""Servers shared by the end-to-end tests: the tiny model, the scripted model, the default model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_model import build_agent_model
from tests.scripted_model import build_scripted_model
from tests.server_process import ServerProcess

API_KEY = "test-key-0123"


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("tiny-server")
    server = ServerProcess(
        "--model", str(tiny_model_dir), "--block-size", "16",
        cache_dir=work / "cache", log_path=work / "server.log",
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
        "--model", str(scripted_model_dir), "--block-size", "16", "--api-key", API_KEY,
        cache_dir=work / "cache", log_path=work / "server.log",
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
        "--model", str(agent_model_dir), "--log-level", "debug",
        cache_dir=work / "cache", log_path=work / "server.log",
    )
    with server:
        yield server
