"""A tar archive written as a stream of chunks, one member at a time (an export's body).

``tarfile`` writes to a file object; an HTTP response is better fed member by member,
so a conversation of any length is never one bytes object. Each member is its header,
its bytes and zero padding to the 512-byte block; two zero blocks end the archive, and
the whole is padded to tar's 10 KiB record as ``tarfile`` would.
"""

from __future__ import annotations

import tarfile

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE


class TarStream:
    """Counts what it has produced, to end the archive on a record boundary."""

    def __init__(self) -> None:
        self.size = 0

    def member(self, name: str, data: bytes) -> bytes:
        """One regular file's header and bytes, padded."""
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o600
        header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
        chunk = header + data + b"\0" * (-len(data) % BLOCK)
        self.size += len(chunk)
        return chunk

    def end(self) -> bytes:
        """The two zero blocks that end a tar, and the padding to a whole record."""
        size = self.size + 2 * BLOCK
        trailer = b"\0" * (2 * BLOCK + (-size % RECORD))
        self.size += len(trailer)
        return trailer
