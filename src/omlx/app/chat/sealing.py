"""Sealed reasoning: the model's reasoning text in an opaque, integrity-protected token.

Clients carry reasoning from one turn to the next only in opaque fields (the Responses
API's ``encrypted_content``, an Anthropic thinking block's ``signature``, which Claude Code
sends back while showing no thinking text). omlx seals the exact text the model produced
there, so when the client sends it back the next prompt renders those same tokens and the
cached prefix still matches. A token omlx did not make, or one that was altered, opens to
nothing.

Format: ``omlx1.<nonce>.<ciphertext>.<tag>`` (URL-safe base64): the text XORed with a
SHA-256 counter-mode keystream, then an HMAC-SHA256 over nonce and ciphertext
(encrypt-then-MAC). The key lives in the cache folder when there is one, so sealed
reasoning survives restarts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import time
from pathlib import Path

log = logging.getLogger(__name__)

_PREFIX = "omlx1"
_KEY_FILE = "reasoning.key"
_KEY_BYTES = 32
_WHOLE_KEY_WAIT_S = 5.0  # for a peer's key file to be written whole


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _read_key(path: Path) -> bytes:
    """The key in ``path``, once whole: servers sharing a cache folder may start together,
    and the one that creates the file writes the key a moment after (a peer read it empty)."""
    deadline = time.monotonic() + _WHOLE_KEY_WAIT_S
    while len(key := path.read_bytes()) < _KEY_BYTES:
        if time.monotonic() > deadline:
            raise ValueError(
                f"{path} holds {len(key)} bytes, not a whole key (a server stopped while "
                "making it?): delete it and start again"
            )
        time.sleep(0.01)
    return key


class ReasoningSeal:
    def __init__(self, key: bytes) -> None:
        if len(key) < _KEY_BYTES:
            raise ValueError("the sealing key must have at least 32 bytes")
        self._enc_key = hashlib.sha256(b"omlx-seal-enc" + key).digest()
        self._mac_key = hashlib.sha256(b"omlx-seal-mac" + key).digest()

    @classmethod
    def for_folder(cls, folder: Path | None) -> ReasoningSeal:
        """The folder's key (made on first use, mode 0600), or a key for this process only."""
        if folder is None:
            return cls(secrets.token_bytes(_KEY_BYTES))
        path = folder / _KEY_FILE
        try:
            return cls(_read_key(path))
        except FileNotFoundError:
            pass
        key = secrets.token_bytes(_KEY_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first
            return cls(_read_key(path))
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        return cls(key)

    def seal(self, text: str) -> str:
        nonce = secrets.token_bytes(12)
        plain = text.encode("utf-8")
        cipher = bytes(a ^ b for a, b in zip(plain, self._stream(nonce, len(plain)), strict=True))
        tag = hmac.new(self._mac_key, nonce + cipher, hashlib.sha256).digest()[:16]
        return ".".join((_PREFIX, _b64(nonce), _b64(cipher), _b64(tag)))

    def open(self, token: str | None) -> str | None:
        """The sealed text, or None for a token this server's key did not seal."""
        if not token or not token.startswith(_PREFIX + "."):
            return None
        try:
            _, nonce_s, cipher_s, tag_s = token.split(".")
            nonce, cipher, tag = _unb64(nonce_s), _unb64(cipher_s), _unb64(tag_s)
        except ValueError:
            return None
        expected = hmac.new(self._mac_key, nonce + cipher, hashlib.sha256).digest()[:16]
        if not hmac.compare_digest(tag, expected):
            return None
        plain = bytes(a ^ b for a, b in zip(cipher, self._stream(nonce, len(cipher)), strict=True))
        try:
            return plain.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _stream(self, nonce: bytes, n: int) -> bytes:
        blocks = []
        for counter in range(-(-n // 32)):
            blocks.append(
                hashlib.sha256(self._enc_key + nonce + counter.to_bytes(8, "big")).digest()
            )
        return b"".join(blocks)[:n]
