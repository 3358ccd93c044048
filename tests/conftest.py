"""Shared fixtures: the optimized BLAS before mlx, the tiny test model, PostgreSQL, SeaweedFS."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from omlx.adapters.mlx.models.blas import load_optimized_blas
from omlx.adapters.sqlindex.urls import sqlite_url
from tests.postgres import PostgresServer, find_bindir
from tests.seaweedfs import SeaweedServer, find_weed
from tests.server_process import terminate_all

# Must run before any test module imports mlx (DESIGN §5).
load_optimized_blas()

from tests.tiny_model import build_tiny_model  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test, the session's servers shut down side by side, not one by one
    (each fixture's ``stop`` then only waits for its own)."""
    if nextitem is None:
        terminate_all()
    yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny-llama")


# --- PostgreSQL: one throw-away server per session, a fresh database per test ----------


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server (tests/postgres.py); skips, saying why, where none can run."""
    bindir, why = find_bindir()
    if bindir is None:
        pytest.skip(why)
    server = PostgresServer(bindir)
    try:
        server.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        server.close()
        pytest.skip(f"PostgreSQL could not start here: {exc}")
    yield server
    server.close()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    """The URL of a new, empty database on the session's server, dropped afterwards."""
    url = postgres.create_database()
    yield url
    postgres.drop_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def index_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The index's URL on each backend: a SQLite file in ``tmp_path``, a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "index.db")
    return request.getfixturevalue("pg_url")


# --- SeaweedFS: one S3-compatible store per session, a fresh key prefix per test ---------


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedServer]:
    """A real ``weed mini`` (tests/seaweedfs.py); skips, saying why, where the binary cannot run."""
    weed, why = find_weed()
    if weed is None:
        pytest.skip(why)
    server = SeaweedServer(weed)
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    yield server
    server.close()


@pytest.fixture
def s3_url(seaweedfs: SeaweedServer) -> str:
    """``s3://bucket/prefix`` of a prefix no other test uses, on the session's store."""
    return seaweedfs.new_prefix()


@pytest.fixture
def own_seaweedfs(tmp_path: Path) -> Iterator[SeaweedServer]:
    """A store this test may stop and start again (the session's one serves other tests)."""
    weed, why = find_weed()
    if weed is None:
        pytest.skip(why)
    server = SeaweedServer(weed, tmp_path / "weed").start()
    yield server
    server.close()
