"""Tenants: several API keys, each its own cache namespace (``--api-keys-file``).

The file holds one ``TENANT KEY`` pair per line; ``#`` starts a comment. A tenant's blocks
are keyed from a root salted with its name (``keys.tenant_root``) on every tier, so one
tenant's prompt is never a hit, nor a timing signal, for another. ``--api-key`` stays for
one key: its requests use the default (unsalted) namespace.
"""

from __future__ import annotations

import re
from pathlib import Path

TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


class KeysFileError(ValueError):
    """A keys file that cannot be used; the message names the file and line."""


def load_keys(path: str | Path) -> dict[str, str]:
    """``{key: tenant}`` from a keys file; every mistake is refused by line, none skipped."""
    source = Path(path).expanduser()
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise KeysFileError(f"api_keys_file {source}: {exc.strerror or exc}") from exc
    keys: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"api_keys_file {source}, line {number}"
        if len(fields) != 2:
            raise KeysFileError(f"{where}: expected 'TENANT KEY', got {len(fields)} fields")
        tenant, key = fields
        if not TENANT_NAME.fullmatch(tenant):
            raise KeysFileError(f"{where}: a tenant name is 1-64 of A-Z a-z 0-9 . _ -")
        if key in keys:
            raise KeysFileError(f"{where}: this key is already tenant {keys[key]!r}'s")
        keys[key] = tenant
    if not keys:
        raise KeysFileError(f"api_keys_file {source}: no 'TENANT KEY' lines")
    return keys
