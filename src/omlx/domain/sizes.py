"""Byte sizes as people write them (``200GB`` decimal, ``4GiB`` binary, ``1048576``) and as we print them.

Below the app and the library alike: settings, the admin CLI, the ``omlx.cache`` facade and
the memory guard's messages all read and write sizes the same way.
"""

from __future__ import annotations

import re
from decimal import Decimal

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: a plain number, or one with B, KB/MB/GB/TB (10**3 steps) or KiB..TiB (2**10)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"bad size {text!r}: use a number of bytes or a number with a unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), e.g. 200GB or 4GiB"
        )
    return int(Decimal(match.group(1)) * _UNITS[unit])


def format_bytes(n: int) -> str:
    """A short human-readable size in decimal units: ``1.5 GB``."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
