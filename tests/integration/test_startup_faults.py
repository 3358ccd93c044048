"""Start-up faults of the cache folder and its index (issue 22 row 8, issue 27 item 1):
one line that names the file and says what to do, exit status 2, no traceback; a damaged
index is moved aside and the server starts on a new one."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from omlx.adapters.sqlindex import index_path, open_index
from omlx.app.cli import main
from omlx.app.settings import Settings
from omlx.app.wiring.bootstrap import _close_all, _open_ssd
from omlx.app.wiring.startup_errors import StartupError, check_cache_folder
from tests.server_process import free_port

# The start-up's own INFO log lines (which BLAS it loaded) come before the mistake is found;
# what is said about the mistake is every other line.
_INFO_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO) ")


def serve(cache_dir: Path) -> tuple[int, list[str]]:
    args = ["serve", "--port", str(free_port()), "--paged-ssd-cache-dir", str(cache_dir)]
    result = CliRunner().invoke(main, args)
    lines = result.stderr.strip().splitlines()
    return result.exit_code, [line for line in lines if not _INFO_LINE.match(line)]


def assert_one_line(code: int, lines: list[str], *needles: str) -> None:
    assert code == 2, (code, lines)
    assert len(lines) == 1 and lines[0].startswith("omlx: "), lines
    assert "Traceback" not in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_a_cache_folder_under_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    code, lines = serve(tmp_path / "afile" / "cache")
    assert_one_line(
        code, lines, f"is under {tmp_path / 'afile'}, which is a file", "--paged-ssd-cache-dir"
    )


def test_a_cache_folder_that_is_a_file(tmp_path):
    (tmp_path / "cache").write_text("x")
    code, lines = serve(tmp_path / "cache")
    assert_one_line(code, lines, "is a file, not a folder", "--no-ssd-cache")


@contextlib.contextmanager
def mounted_tmpfs(options: str) -> Iterator[Path]:
    """A small tmpfs (root only: where it cannot be mounted the test skips)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    folder = Path(tempfile.mkdtemp(prefix="omlx-fault-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True
    )
    if done.returncode != 0:
        folder.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.rmdir()


def test_a_read_only_cache_folder():
    with mounted_tmpfs("ro,size=1m") as folder:
        code, lines = serve(folder)
    assert_one_line(
        code,
        lines,
        f"the cache folder {folder} is read-only (EROFS",
        "writable --paged-ssd-cache-dir",
    )


def test_a_cache_folder_the_user_cannot_write(tmp_path):
    """As an unprivileged user (root writes anywhere): the check runs in a forked child that
    gives up root; the CLI tests above show its line reaching stderr the same way."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    base = Path(tempfile.mkdtemp(prefix="omlx-perm-"))
    cache = base / "cache"
    cache.mkdir()
    base.chmod(0o755)
    cache.chmod(0o555)  # the user may read it, not write it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, run the check, report its line
        message = "no error"
        try:
            os.setgid(65534)
            os.setuid(65534)
            check_cache_folder(cache)
            check_cache_folder(base / "new" / "cache")
        except StartupError as exc:
            message = str(exc)
        except BaseException as exc:
            message = f"unexpected {type(exc).__name__}: {exc}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    message = os.read(read, 4096).decode()
    os.close(read)
    shutil.rmtree(base, ignore_errors=True)
    assert message.startswith(f"the cache folder {cache} is not writable by this user (EACCES"), (
        message
    )
    assert "--paged-ssd-cache-dir" in message


@pytest.mark.parametrize("damage", ["garbage", "malformed"])
def test_a_damaged_index_is_moved_aside_and_a_new_one_made(tmp_path, caplog, damage):
    index = open_index(tmp_path)
    index.close()
    db = index_path(tmp_path)
    if damage == "garbage":
        db.write_bytes(b"this is not a database at all" * 200)
    else:
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA journal_mode=DELETE")
        data = bytearray(db.read_bytes())
        data[4096 : 4096 + 2048] = os.urandom(2048)  # a damaged page past the header
        db.write_bytes(bytes(data))
    closers: list = []
    with caplog.at_level(logging.WARNING, logger="omlx"):
        parts = _open_ssd(Settings(paged_ssd_cache_dir=str(tmp_path)), closers)
    try:
        assert parts.index.block_count() == 0
    finally:
        _close_all(closers)
    moved = sorted(tmp_path.glob("index.db.damaged-*"))
    assert moved and moved[0].suffix != "-wal"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert (
        len(warnings) == 1
        and f"the index {db} is damaged" in warnings[0]
        and str(moved[0]) in warnings[0]
    )
