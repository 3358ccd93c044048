"""Tenants and roles: several API keys, each its own cache namespace (``--api-keys-file``).

The file holds one ``TENANT KEY [ROLE]`` line per key; a line whose first character
(after blanks) is ``#`` is a comment, and nothing else is: a key may hold ``#``. ROLE is
``tenant`` (the default: the key acts on its tenant's cache alone) or ``operator`` (it
may act on the whole server: unload, clear, vacuum, every tenant's stats). A tenant's
blocks are keyed from a root salted with its name (``keys.tenant_root``) on every tier,
so one tenant's prompt is never a hit, nor a timing signal, for another.

``--api-key`` is the operator's key of the default (unsalted) namespace; a server with
no key at all has one caller, the local user, who is its operator.
"""

from __future__ import annotations

import logging
import re
import stat
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MIN_KEY_CHARS = 16  # a key is a secret: a short one is guessed, not a typo to pass
ROLES = ("tenant", "operator")


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request's key belongs to: its tenant (None: the default one) and its role."""

    tenant: str | None = None
    operator: bool = True

    @property
    def role(self) -> str:
        return "operator" if self.operator else "tenant"


LOCAL_USER = Caller()  # a server without keys: whoever reaches the port runs it


class KeysFileError(ValueError):
    """A keys file that cannot be used; the message names the file and line."""


def load_keys(path: str | Path, api_key: str = "") -> dict[str, Caller]:
    """``{key: caller}`` from a keys file; every mistake is refused by line, none skipped.

    ``api_key`` (``--api-key``) is the default tenant's operator key: the file may not
    give it to anyone else.
    """
    source = Path(path).expanduser()
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
        mode = source.stat().st_mode
    except OSError as exc:
        raise KeysFileError(f"api_keys_file {source}: {exc.strerror or exc}") from exc
    if mode & stat.S_IROTH:
        log.warning(
            "api_keys_file %s is readable by every user of this machine (mode %o): "
            "chmod 600 it to keep its keys secret",
            source,
            stat.S_IMODE(mode),
        )
    keys: dict[str, Caller] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"api_keys_file {source}, line {number}"
        fields = line.split()
        if len(fields) not in (2, 3):
            raise KeysFileError(
                f"{where}: expected 'TENANT KEY [tenant|operator]', got {len(fields)} fields"
            )
        tenant, key = fields[:2]
        role = fields[2] if len(fields) == 3 else "tenant"
        if not TENANT_NAME.fullmatch(tenant):
            raise KeysFileError(f"{where}: a tenant name is 1-64 of A-Z a-z 0-9 . _ -")
        if len(key) < MIN_KEY_CHARS:
            raise KeysFileError(f"{where}: a key is at least {MIN_KEY_CHARS} characters")
        if role not in ROLES:
            raise KeysFileError(f"{where}: the role is 'tenant' or 'operator', not {role!r}")
        if api_key and key == api_key:
            raise KeysFileError(
                f"{where}: this key is also --api-key (the default tenant's operator key); "
                "give each holder a key of its own"
            )
        if key in keys:
            raise KeysFileError(f"{where}: this key is already tenant {keys[key].tenant!r}'s")
        keys[key] = Caller(tenant, operator=role == "operator")
    if not keys:
        raise KeysFileError(f"api_keys_file {source}: no 'TENANT KEY' lines")
    return keys
