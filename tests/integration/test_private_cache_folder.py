"""The cache folder is private to the server's user: folders 0700, files 0600, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from omlx.adapters.cold_folder import open_cold_folder
from omlx.domain.cache.blocks import NamespaceInfo

NAMESPACE = NamespaceInfo("ab" * 32, "tiny/model", "/models/tiny", 4, "float16", 2)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_folders_are_0700_and_files_0600_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    root = tmp_path / "nested" / "cache"
    old = os.umask(umask)
    try:
        folder = open_cold_folder(root, None)
        try:
            relpath = folder.store.relpath(NAMESPACE, "cd" * 32, "ef" * 32)
            folder.store.write(relpath, b"block bytes")
            with folder.index.engine.begin() as conn:  # makes SQLite write its WAL
                conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS probe (x)")
        finally:
            folder.close()
    finally:
        os.umask(old)
    folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
    files = [p for p in root.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"index.db", Path(relpath).name}
    assert {str(p.relative_to(tmp_path)): mode(p) for p in folders} == {
        str(p.relative_to(tmp_path)): 0o700 for p in folders
    }
    assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    assert mode(tmp_path / "nested") == 0o700  # a parent the server made is its own too


def test_an_existing_0755_folder_is_made_private_when_opened(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    open_cold_folder(root, None).close()
    assert mode(root) == 0o700
