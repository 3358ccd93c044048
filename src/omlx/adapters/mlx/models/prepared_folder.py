"""The prepared-weights folder's layout and listing, without importing MLX (the admin CLI reads it).

See ``prepared.py`` for what the copies are and how they are written and loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PREPARED_DIR = ".prepared-weights"
MANIFEST = "omlx-prepared.json"
TEMP_PREFIX = ".tmp-"


@dataclass(frozen=True, slots=True)
class PreparedCopy:
    path: Path
    nbytes: int
    last_used: float  # the manifest's mtime: touched at each load


def list_copies(root: Path) -> list[PreparedCopy]:
    """The complete copies under ``root``, least recently loaded first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        manifest = entry / MANIFEST
        if entry.name.startswith(TEMP_PREFIX) or not manifest.is_file():
            continue
        nbytes = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
        found.append(PreparedCopy(entry, nbytes, manifest.stat().st_mtime))
    return sorted(found, key=lambda c: c.last_used)
