"""Two ``omlx serve`` processes on one PostgreSQL index and one SeaweedFS bucket
(docs/multi-machine.md, "Blocks in an object store").

Real processes, a real PostgreSQL, a real SeaweedFS, the tiny model; each server has its
own local cache folder (its lock and its read-through copies), as on two hosts. B
restores what A computed; a tiny budget holds across both; A killed between an object's
PUT and its row leaves nothing a sweep does not clear; wrong keys stop a start in one
line, a store that does not answer does not. Each test ends with the invariant over the
bucket: rows <=> complete objects, usage within the budget.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from omlx.adapters.blockfiles.store import key_of
from omlx.adapters.objectstore import S3BlockStore, S3Location
from omlx.adapters.sqlindex import connect_index
from tests.e2e.test_shared_cold_tier import SYSTEM, chat, clean_logs, rows, settle
from tests.seaweedfs import SeaweedServer
from tests.server_process import ServerProcess
from tests.storage_checks import assert_store_invariants


def serve(
    name: str,
    model: Path,
    tmp: Path,
    index_url: str,
    store_url: str,
    weed: SeaweedServer,
    *extra: str,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """A server with its own local folder (lock, copies), the shared index and bucket."""
    return ServerProcess(
        "--model",
        str(model),
        "--block-size",
        "16",
        "--index-url",
        index_url,
        "--block-store",
        store_url,
        "--server-id",
        name,
        *extra,
        cache_dir=tmp / f"local-{name}",
        log_path=tmp / f"{name}.log",
        env={**weed.env(), **(env or {})},
    )


def bucket(weed: SeaweedServer, store_url: str) -> S3BlockStore:
    return S3BlockStore(S3Location.parse(store_url), weed.access())


def test_b_restores_the_prefix_a_computed_from_the_bucket(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str, seaweedfs: SeaweedServer, s3_url: str
) -> None:
    budget = "4MB"
    with (
        serve(
            "a",
            tiny_model_dir,
            tmp_path,
            pg_url,
            s3_url,
            seaweedfs,
            "--paged-ssd-cache-max-size",
            budget,
        ) as a,
        serve(
            "b",
            tiny_model_dir,
            tmp_path,
            pg_url,
            s3_url,
            seaweedfs,
            "--paged-ssd-cache-max-size",
            budget,
        ) as b,
    ):
        first = chat(a, "List the files.")
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        settle(pg_url, at_least=first.usage.prompt_tokens // 16)
        replay = chat(b, "List the files.")  # B's RAM and copies are empty: all from the bucket
        assert replay.usage.prompt_tokens_details.cached_tokens == replay.usage.prompt_tokens - 1
        assert replay.choices[0].message.content == first.choices[0].message.content
        log_b = b.read_log()
        assert "blocks in object store " + s3_url in log_b
        assert "cache folder reconciled" in a.read_log() + log_b
        clean_logs(a, b)
        copies = tmp_path / "local-b" / ".read-through"  # B keeps what it fetched
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            sum(1 for _ in copies.rglob("*.safetensors")) < replay.usage.prompt_tokens // 16
        ):
            time.sleep(0.1)
        assert sum(1 for _ in copies.rglob("*.safetensors")) >= replay.usage.prompt_tokens // 16
    keys = Counter(key_of(rel) for rel in bucket(seaweedfs, s3_url).iter_relpaths())
    assert keys and max(keys.values()) == 1  # one object per key: 0 duplicates
    assert_store_invariants(bucket(seaweedfs, s3_url), pg_url, 4 * 10**6)


@pytest.mark.slow
def test_a_tiny_budget_holds_across_both_servers_in_the_bucket(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str, seaweedfs: SeaweedServer, s3_url: str
) -> None:
    budget = 96 * 1024  # about ten blocks of the tiny model, against ~30 per prompt
    env = {"OMLX_EVICTION_LEASE_SECONDS": "0.5"}
    args = ("--paged-ssd-cache-max-size", "96KiB")
    with (
        serve("a", tiny_model_dir, tmp_path, pg_url, s3_url, seaweedfs, *args, env=env) as a,
        serve("b", tiny_model_dir, tmp_path, pg_url, s3_url, seaweedfs, *args, env=env) as b,
    ):
        peak = 0
        for i in range(6):
            reply = chat((a, b)[i % 2], f"Question {i}.", f"Prompt {i}. " + SYSTEM)
            assert reply.choices[0].message.content
            time.sleep(0.6)
            index = connect_index(pg_url, migrate=False)
            peak = max(peak, index.total_bytes())
            index.close()
        settle(pg_url)
        clean_logs(a, b)
    assert peak <= budget + 2 * 10 * 1024  # at most a block in flight per server beyond it
    print(f"\ntiny budget {budget} B in the bucket: peak {peak} B sampled across A and B")
    assert_store_invariants(bucket(seaweedfs, s3_url), pg_url, budget)


def _plain_url(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://")


@pytest.mark.slow
def test_kill_9_between_put_and_row_then_a_sweep_leaves_nothing_behind(
    tiny_model_dir: Path, tmp_path: Path, pg_url: str, seaweedfs: SeaweedServer, s3_url: str
) -> None:
    import psycopg

    env = {"OMLX_RECONCILE_GRACE_SECONDS": "2"}
    a = serve("a", tiny_model_dir, tmp_path, pg_url, s3_url, seaweedfs, env=env).start()
    store = bucket(seaweedfs, s3_url)
    try:
        # Hold the blocks table: A's writer PUTs an object, then waits on its row's INSERT.
        with psycopg.connect(_plain_url(pg_url)) as conn:
            conn.execute("LOCK TABLE blocks IN EXCLUSIVE MODE")
            asking = threading.Thread(target=lambda: _quietly(chat, a, "Go.", SYSTEM), daemon=True)
            asking.start()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not list(store.iter_relpaths()):
                time.sleep(0.05)
            objects = list(store.iter_relpaths())
            a.kill()  # SIGKILL between an object's PUT and its row
            conn.rollback()
        assert objects, a.read_log()[-2000:]
        assert rows(pg_url) == 0  # no row names an object that is not there
        left = len(list(store.iter_relpaths()))
        time.sleep(2.5)  # past the grace: what A left is stale to any sweep
        a = serve("a", tiny_model_dir, tmp_path, pg_url, s3_url, seaweedfs, env=env).start()
        deadline = time.monotonic() + 30
        while "cache folder reconciled" not in a.read_log() and time.monotonic() < deadline:
            time.sleep(0.2)
        report = [line for line in a.read_log().splitlines() if "cache folder reconciled" in line]
        assert report and "files without rows" in report[-1], a.read_log()[-2000:]
        assert list(store.iter_relpaths()) == []  # the sweep took every orphan
        reply = chat(a, "Go.")  # and the server computes and stores it again
        settle(pg_url, at_least=reply.usage.prompt_tokens // 16)
        print(f"\nkill -9 between PUT and row: {left} orphan objects; restart: {report[-1]}")
    finally:
        a.stop()
    verify = _admin(
        "cache",
        "verify",
        "--cache-dir",
        str(tmp_path / "local-a"),
        "--index-url",
        pg_url,
        "--block-store",
        s3_url,
        env=seaweedfs.env(),
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert_store_invariants(store, pg_url)


@pytest.mark.slow
def test_wrong_keys_stop_the_start_and_a_silent_store_does_not(
    tiny_model_dir: Path, tmp_path: Path, seaweedfs: SeaweedServer, s3_url: str
) -> None:
    base = [sys.executable, "-m", "omlx", "serve", "--model", str(tiny_model_dir), "--port", "1"]
    wrong = subprocess.run(
        [*base, "--paged-ssd-cache-dir", str(tmp_path / "w"), "--block-store", s3_url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_environ(), **seaweedfs.env(AWS_SECRET_ACCESS_KEY="not-the-secret")},
    )
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert wrong.stderr.strip().splitlines()[-1].startswith("omlx: object store refused:")
    assert "403" in wrong.stderr
    silent = ServerProcess(
        "--model",
        str(tiny_model_dir),
        "--block-store",
        s3_url,
        cache_dir=tmp_path / "s",
        log_path=tmp_path / "s.log",
        env=seaweedfs.env(AWS_ENDPOINT_URL="http://127.0.0.1:9"),
    )
    with silent:
        reply = chat(silent, "Hello.")  # computed: the store does not answer
        assert reply.choices[0].message.content
        log = silent.read_log()
    assert log.count("does not answer") == 1 and "Traceback" not in log


def _quietly(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        return


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def _admin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omlx", "admin", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_environ(), **env},
    )
