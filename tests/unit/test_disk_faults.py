"""Disk faults named from their errors, logged once per episode (issue 22 row 7)."""

from __future__ import annotations

import errno
import logging
import sqlite3

from sqlalchemy.exc import OperationalError

from omlx.adapters.disk_faults import (
    DAMAGED,
    IO_ERROR,
    NO_SPACE,
    READ_ONLY,
    FaultEpisodes,
    fault_of,
)


def test_faults_are_named_from_oserrors_and_sqlite_messages():
    assert fault_of(OSError(errno.ENOSPC, "No space left on device")) == NO_SPACE
    assert fault_of(OSError(errno.EROFS, "Read-only file system")) == READ_ONLY
    assert fault_of(PermissionError(errno.EACCES, "Permission denied")) == READ_ONLY
    wrapped = OperationalError(
        "INSERT", {}, sqlite3.OperationalError("attempt to write a readonly database")
    )
    assert fault_of(wrapped) == READ_ONLY
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("while writing") from inner
    except RuntimeError as outer:
        assert fault_of(outer) == NO_SPACE
    assert fault_of(ValueError("bad block")) is None
    assert fault_of(OSError(errno.EIO, "I/O error")) == IO_ERROR
    assert (
        fault_of(OperationalError("COMMIT", {}, sqlite3.OperationalError("disk I/O error")))
        == IO_ERROR
    )
    assert fault_of(OSError(errno.ENOENT, "No such file")) is None
    malformed = sqlite3.DatabaseError("database disk image is malformed")
    assert fault_of(OperationalError("SELECT", {}, malformed)) == DAMAGED


def test_one_warning_per_episode_one_recovery_line_and_no_flapping(caplog):
    log = logging.getLogger("omlx.test.faults")
    episodes = FaultEpisodes("cache folder /x", log, quiet_s=3600)
    with caplog.at_level(logging.WARNING, logger="omlx.test.faults"):
        for _ in range(50):
            episodes.failed(NO_SPACE, OSError(errno.ENOSPC, "No space left on device"))
        episodes.succeeded()
        episodes.succeeded()
        for _ in range(3):  # back within the quiet time: the same trouble, said already
            episodes.failed(NO_SPACE, "no room")
            episodes.succeeded()
        episodes.failed(
            READ_ONLY, OSError(errno.EROFS, "Read-only file system")
        )  # a new kind: said
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "cache folder /x: out of space (ENOSPC: No space left on device); blocks are not written until there is room",
        "cache folder /x: written again (50 writes dropped while out of space)",
        "cache folder /x: read-only or not writable (EROFS: Read-only file system); blocks are not written "
        "until it is writable again",
    ]


def test_two_faults_in_turns_are_each_said_once(caplog):
    """A frozen folder: new block files fail with EPERM, the open index with an I/O error,
    in whatever order the threads meet them; each is said once, not at every change."""
    log = logging.getLogger("omlx.test.faults")
    episodes = FaultEpisodes("cache folder /x", log, quiet_s=3600)
    with caplog.at_level(logging.WARNING, logger="omlx.test.faults"):
        for _ in range(5):
            episodes.failed(READ_ONLY, OSError(errno.EPERM, "Operation not permitted"))
            episodes.failed(IO_ERROR, "disk I/O error")
        episodes.succeeded()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert "read-only or not writable" in lines[0] and "writes fail" in lines[1]
    assert lines[2] == "cache folder /x: written again (10 writes dropped while writes failed)"


def test_a_damaged_index_is_one_episode_whatever_sqlite_reports_next(caplog):
    """SQLite reads some pages of a damaged file as I/O errors: still the damage, said once."""
    log = logging.getLogger("omlx.test.faults")
    episodes = FaultEpisodes("cache folder /x", log, quiet_s=0)
    with caplog.at_level(logging.WARNING, logger="omlx.test.faults"):
        for _ in range(5):
            episodes.failed(DAMAGED, "database disk image is malformed")
            episodes.failed(IO_ERROR, "disk I/O error")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "its index is damaged" in lines[0]
    assert episodes.fault == DAMAGED


def test_a_temp_file_a_failed_write_could_not_remove_goes_at_the_next_write(tmp_path, monkeypatch):
    """The folder turned immutable between creating the temp file and cleaning it up."""
    import os
    from pathlib import Path

    from omlx.adapters.blockfiles.store import FileBlockStore

    store = FileBlockStore(tmp_path)
    real_replace, real_unlink = os.replace, Path.unlink
    monkeypatch.setattr(
        os, "replace", lambda *a: (_ for _ in ()).throw(PermissionError(errno.EPERM, "immutable"))
    )
    monkeypatch.setattr(
        Path,
        "unlink",
        lambda *a, **k: (_ for _ in ()).throw(PermissionError(errno.EPERM, "immutable")),
    )
    try:
        store.write("m/ab/abc.safetensors", b"x" * 10)
    except PermissionError:
        pass
    else:
        raise AssertionError("the write should have failed")
    assert [rel for rel, _ in store.iter_temp_files()]  # left behind: it could not be removed
    monkeypatch.setattr(os, "replace", real_replace)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    store.write("m/ab/abd.safetensors", b"y" * 10)
    assert not list(store.iter_temp_files())
    store.close()
