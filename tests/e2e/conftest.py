"""Servers shared by the end-to-end tests: the tiny model and the default model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server_process import ServerProcess


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
def default_server(tmp_path_factory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("default-server")
    server = ServerProcess(cache_dir=work / "cache", log_path=work / "server.log")
    with server:
        yield server
