"""The fault suite (issue 22): a full disk and a read-only cache folder while serving, a
damaged index at start, PostgreSQL stopped and restarted. Requests keep being answered,
nothing stored is lost (rows <=> files afterwards; what was stored before is still
there), and each fault is exactly its one line in the log, with no traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.postgres import PostgresServer, find_bindir
from tests.server_process import ServerProcess
from tests.storage_checks import assert_cache_invariants
from tests.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("fault-model") / "chat", seed=1)


@contextlib.contextmanager
def tmpfs(size: str) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a tmpfs needs root")
    folder = Path(tempfile.mkdtemp(prefix="omlx-faults-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True
    )
    if done.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        with contextlib.suppress(OSError):
            folder.rmdir()


def ask(base: str, text: str) -> dict:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        "temperature": 0,
    }
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def respond(base: str, text: str) -> dict:
    r = httpx.post(
        base + "/v1/responses",
        json={"model": "chat", "input": text, "max_output_tokens": 2},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def prompt(i: int) -> str:
    return f"conversation {i}: " + " ".join(f"word{i}x{k}" for k in range(120))


def dropped(base: str, reason: str) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("omlx_cache_blocks_dropped_total") and f'reason="{reason}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def lines_with(log: str, text: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


def test_a_full_disk_while_serving(chat_model, tmp_path):
    with tmpfs("24m") as cache:
        server = ServerProcess(
            "--model",
            str(chat_model),
            "--block-size",
            "16",
            cache_dir=cache,
            log_path=tmp_path / "server.log",
        )
        with server:
            base = server.base_url
            ask(base, prompt(0))
            kept = respond(base, "stored before the disk filled")
            filler = cache / "filler"
            with contextlib.suppress(OSError), open(filler, "wb") as f:  # fill it to the last byte
                while True:
                    f.write(b"\0" * (1 << 20))
            for i in range(1, 8):
                ask(base, prompt(i))
            wait_for(lambda: dropped(base, "no_space") > 0)
            unstored = respond(base, "stored while the disk is full?")
            filler.unlink()
            time.sleep(1.5)
            ask(base, prompt(100))
            wait_for(lambda: "written again" in server.read_log())
            assert httpx.get(f"{base}/v1/responses/{kept['id']}", timeout=10).status_code == 200
        log = server.read_log()
        assert_cache_invariants(cache)
    assert len(lines_with(log, ": out of space (")) == 1, lines_with(log, "out of space")
    assert len(lines_with(log, "written again")) == 1
    assert (
        unstored["store"] is False
        and len(lines_with(log, f"response {unstored['id']} not stored")) == 1
    )
    assert "Traceback" not in log


def immutable(folder: Path, on: bool) -> None:
    """``chattr +i`` on the folder and everything in it but the index's ``-shm`` file:
    nothing can be created or changed, even by root (a read-only remount is refused while
    the server has files open for writing).

    The ``-shm`` file stays writable because SQLite maps it into memory and every reader
    writes to it; the kernel answers a write into a mapped page of an immutable file with
    SIGBUS, which no program can survive (docs/guide.md, "A cache folder that became
    read-only"). The WAL and the database file are frozen, so the index's writes fail."""
    # A block's temporary file may be renamed away meanwhile: left out, as it cannot be
    # renamed into a frozen folder anyway.
    paths = [p for p in (folder, *folder.rglob("*")) if not p.name.endswith(("-shm", ".tmp"))]
    subprocess.run(
        ["chattr", "+i" if on else "-i", *(str(p) for p in paths)],
        check=True,
        capture_output=True,
    )


def test_a_cache_folder_made_read_only_while_serving(chat_model, tmp_path):
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("making a folder immutable needs root and chattr")
    cache = tmp_path / "cache"
    server = ServerProcess(
        "--model",
        str(chat_model),
        "--block-size",
        "16",
        cache_dir=cache,
        log_path=tmp_path / "server.log",
    )
    with server:
        base = server.base_url
        ask(base, prompt(0))
        kept = respond(base, "stored before")
        try:
            immutable(cache, True)
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"chattr +i is not supported here: {exc.stderr.decode().strip()}")
        try:
            for i in range(1, 6):
                ask(base, prompt(i))
            wait_for(lambda: dropped(base, "read_only") > 0)
            unstored = respond(base, "stored while read-only?")
        finally:
            immutable(cache, False)
        time.sleep(1.5)
        ask(base, prompt(100))
        wait_for(lambda: "written again" in server.read_log())
        assert httpx.get(f"{base}/v1/responses/{kept['id']}", timeout=10).status_code == 200
    log = server.read_log()
    assert_cache_invariants(cache)
    assert unstored["store"] is False
    # Files it creates are refused (EPERM); the index it holds open fails its writes (IOERR).
    starts = lines_with(log, ": read-only or not writable (") + lines_with(log, ": writes fail (")
    assert 1 <= len(starts) <= 2, starts
    assert len(lines_with(log, "written again")) == 1
    assert "Traceback" not in log


def test_a_damaged_index_at_start_is_moved_aside_and_the_server_serves(chat_model, tmp_path):
    cache = tmp_path / "cache"
    server = ServerProcess(
        "--model",
        str(chat_model),
        "--block-size",
        "16",
        cache_dir=cache,
        log_path=tmp_path / "first.log",
    )
    with server:
        ask(server.base_url, prompt(0))
    (cache / "index.db").write_bytes(b"garbage" * 1000)
    for extra in ("index.db-wal", "index.db-shm"):
        (cache / extra).unlink(missing_ok=True)
    again = ServerProcess(
        "--model",
        str(chat_model),
        "--block-size",
        "16",
        cache_dir=cache,
        log_path=tmp_path / "second.log",
    )
    with again:
        ask(again.base_url, prompt(0))
    log = again.read_log()
    assert len(lines_with(log, "is damaged")) == 1 and "Traceback" not in log
    assert list(cache.glob("index.db.damaged-*"))
    assert_cache_invariants(cache)


def test_postgresql_stopped_and_restarted(chat_model, tmp_path):
    bindir, why = find_bindir()
    if bindir is None:
        pytest.skip(why)
    pg = PostgresServer(bindir)
    pg.start()
    try:
        url = pg.create_database()
        server = ServerProcess(
            "--model",
            str(chat_model),
            "--block-size",
            "16",
            "--index-url",
            url,
            cache_dir=tmp_path / "cache",
            log_path=tmp_path / "server.log",
        )
        with server:
            base = server.base_url
            kept = respond(base, "stored before the outage")
            pg.stop()
            ask(base, prompt(1))  # chat is served through the outage
            during = respond(base, "stored during the outage?")
            got = httpx.get(f"{base}/v1/responses/{kept['id']}", timeout=30)
            follow = httpx.post(
                base + "/v1/responses",
                timeout=30,
                json={
                    "model": "chat",
                    "input": "more",
                    "max_output_tokens": 2,
                    "previous_response_id": kept["id"],
                },
            )
            pg.start()
            wait_for(
                lambda: (
                    httpx.get(f"{base}/v1/responses/{kept['id']}", timeout=30).status_code == 200
                ),
                30,
            )
            after = respond(base, "stored after")
            assert httpx.get(f"{base}/v1/responses/{after['id']}", timeout=10).status_code == 200
        log = server.read_log()
    finally:
        pg.close()
    assert during["store"] is False
    assert got.status_code == 503 and got.json()["error"]["code"] == "store_unavailable"
    assert follow.status_code == 503
    assert len(lines_with(log, "unreachable")) >= 1 and "Traceback" not in log, lines_with(
        log, "unreachable"
    )
    assert len(lines_with(log, "answers again")) >= 1


def test_an_index_damaged_while_serving(chat_model, tmp_path):
    cache = tmp_path / "cache"
    server = ServerProcess(
        "--model",
        str(chat_model),
        "--block-size",
        "16",
        cache_dir=cache,
        log_path=tmp_path / "first.log",
    )
    with server:
        base = server.base_url
        for i in range(3):
            ask(base, prompt(i))
        time.sleep(1.5)  # the writer has recorded those blocks
        db = cache / "index.db"
        data = bytearray(db.read_bytes())
        data[100 : len(data)] = os.urandom(len(data) - 100)  # every page after the header
        db.write_bytes(bytes(data))
        (cache / "index.db-wal").write_bytes(os.urandom(8192))
        for i in range(3, 9):  # still answered: lookups miss, writes are dropped
            ask(base, prompt(i))
        time.sleep(1.5)
        log = server.read_log()
    assert "Traceback" not in log
    assert len(lines_with(log, ": its index is damaged (")) == 1, lines_with(log, "damaged")
    again = ServerProcess(
        "--model",
        str(chat_model),
        "--block-size",
        "16",
        cache_dir=cache,
        log_path=tmp_path / "second.log",
    )
    with again:
        ask(again.base_url, prompt(0))
    log = again.read_log()
    assert len(lines_with(log, "is damaged")) == 1 and "Traceback" not in log
    assert_cache_invariants(cache)
