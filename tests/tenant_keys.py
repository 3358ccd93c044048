"""The keys the role tests share: two tenants, an operator of the keys file and the
``--api-key`` operator, and the keys file that names them."""

from __future__ import annotations

from pathlib import Path

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-0123456789"
OPS = "sk-ops-0123456789"
ROOT = "sk-root-0123456789"  # --api-key: the default tenant's operator


def keys_file(folder: Path, *, operator: bool = True) -> Path:
    """``folder/keys``: alice and bob as tenants, and ops as an operator (``operator``),
    private to this user as the server asks (0600)."""
    path = folder / "keys"
    lines = [f"alice {ALICE}", f"bob {BOB}"] + ([f"ops {OPS} operator"] if operator else [])
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path
