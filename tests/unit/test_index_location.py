"""Where the index may live: URLs, the network-filesystem refusal, the settings keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from omlx.adapters.sqlindex.netfs import (
    NetworkFilesystemError,
    _longest_match,
    filesystem_type,
    parse_bsd_mount_output,
    parse_linux_mounts,
    refuse_network_filesystem,
)
from omlx.adapters.sqlindex.urls import backend, display, to_url
from omlx.app.settings import load_settings

LINUX = """\
/dev/vda / ext4 rw,relatime 0 0
nas:/export/omlx /mnt/omlx nfs4 rw,hard,lookupcache=positive 0 0
//mac/cache /mnt/smb\\040share cifs rw 0 0
tmpfs /mnt/omlx/local tmpfs rw 0 0
"""
MACOS = """\
/dev/disk3s1s1 on / (apfs, sealed, local, read-only, journaled)
//me@nas._smb._tcp.local/omlx on /Volumes/omlx (smbfs, nodev, nosuid, mounted by me)
nas:/export on /private/nfs (nfs, asynchronous)
"""


def test_mount_tables_parse_and_the_longest_mount_point_wins() -> None:
    linux = parse_linux_mounts(LINUX)
    assert ("/mnt/smb share", "cifs") in linux
    assert _longest_match(Path("/mnt/omlx/cache/index.db"), linux) == "nfs4"
    assert _longest_match(Path("/mnt/omlx/local/index.db"), linux) == "tmpfs"
    assert _longest_match(Path("/home/me/.omlx/cache"), linux) == "ext4"
    mac = parse_bsd_mount_output(MACOS)
    assert _longest_match(Path("/Volumes/omlx/cache"), mac) == "smbfs"
    assert _longest_match(Path("/private/nfs/x"), mac) == "nfs"
    assert _longest_match(Path("/Users/me"), mac) == "apfs"


def test_network_filesystems_are_refused_local_ones_not(tmp_path: Path) -> None:
    for kind in ("nfs", "nfs4", "cifs", "smbfs", "smb3", "fuse.sshfs"):
        with pytest.raises(NetworkFilesystemError, match="PostgreSQL index"):
            refuse_network_filesystem(tmp_path / "index.db", kind)
    for kind in ("ext4", "apfs", "xfs", "tmpfs", None):
        refuse_network_filesystem(tmp_path / "index.db", kind)
    local = filesystem_type(tmp_path / "not" / "yet" / "index.db")  # nearest existing folder
    assert local is not None and local not in ("nfs", "nfs4", "cifs")
    refuse_network_filesystem(tmp_path / "index.db")


def test_index_urls() -> None:
    assert backend("/tmp/x/index.db") == "sqlite" and backend("sqlite:///x.db") == "sqlite"
    assert to_url("postgresql://h/db").drivername == "postgresql+psycopg"
    assert display("postgresql+psycopg://u:secret@h/db") == "postgresql+psycopg://u:***@h/db"
    with pytest.raises(ValueError, match="only sqlite"):
        to_url("mysql://h/db")


def test_shared_index_settings(tmp_path: Path) -> None:
    settings = load_settings(
        env={"OMLX_INDEX_URL": "postgresql+psycopg://h/omlx", "OMLX_EVICTION_LEASE_SECONDS": "2.5"},
        flags={"server_id": "studio-1", "port": 9000},
    )
    assert settings.index_url == "postgresql+psycopg://h/omlx"
    assert settings.eviction_lease_seconds == 2.5 and settings.reconcile_grace_seconds == 60
    assert settings.server_identity == "studio-1"
    assert load_settings(env={}, flags={"port": 9001}).server_identity.endswith("-9001")
    with pytest.raises(ValueError, match="not a URL"):
        load_settings(env={}, flags={"index_url": "/some/path"})
    with pytest.raises(ValueError, match=">= 0"):
        load_settings(env={"OMLX_RECONCILE_GRACE_SECONDS": "-1"})
