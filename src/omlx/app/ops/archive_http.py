"""Cache archives to and from a running server, streamed both ways (standard library only).

An archive may be gigabytes, so neither direction holds it in memory: an export's body is
copied to the output file as it arrives; an import's file is sent in chunks after the
server has agreed to take it. The import asks first (``Expect: 100-continue``): a server
that refuses the body (too large, a wrong key, an unknown model) answers before any of it
is sent, and that answer is shown, not the "Connection reset" or "Broken pipe" a client
gets when it keeps sending into a closed connection.
"""

from __future__ import annotations

import http.client
import json
import select
import shutil
import socket
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

import click

CHUNK = 1 << 20
CONTINUE_WAIT_S = 30.0  # for the server's go-ahead (it may be loading the model)
TIMEOUT_S = 3600.0


def _connect(url: str) -> tuple[http.client.HTTPConnection, str]:
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return kind(parts.hostname or "127.0.0.1", parts.port, timeout=TIMEOUT_S), parts.path.rstrip(
        "/"
    )


def _headers(key: str | None, kind: str) -> dict[str, str]:
    headers = {"content-type": kind}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return headers


def _failure(method: str, path: str, response: http.client.HTTPResponse) -> click.ClickException:
    raw = response.read()
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw.decode(errors="replace")[:500] or response.reason
    return click.ClickException(f"{method} {path}: {response.status} {message}")


def export_to_file(
    url: str, path: str, key: str | None, body: Any, out: Path
) -> tuple[int, dict[str, str]]:
    """POST ``body`` (JSON) and copy the archive answered to ``out``; its size and headers."""
    conn, base = _connect(url)
    try:
        conn.request(
            "POST", base + path, json.dumps(body).encode(), _headers(key, "application/json")
        )
        response = conn.getresponse()
        if response.status != 200:
            raise _failure("POST", path, response)
        with out.open("wb") as handle:
            shutil.copyfileobj(response, handle, CHUNK)
            size = handle.tell()
        return size, {k.lower(): v for k, v in response.getheaders()}
    except OSError as exc:
        raise click.ClickException(f"cannot reach the server at {url}: {exc}") from exc
    finally:
        conn.close()


def import_file(url: str, path: str, key: str | None, archive: Path) -> Any:
    """POST ``archive``'s bytes, streamed once the server agrees; its JSON answer."""
    conn, base = _connect(url)
    size = archive.stat().st_size
    headers = {
        **_headers(key, "application/x-tar"),
        "content-length": str(size),
        "expect": "100-continue",
    }
    try:
        conn.putrequest("POST", base + path)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        if not _may_send(conn):  # the server answered already: a refusal
            raise _failure("POST", path, conn.getresponse())
        try:
            with archive.open("rb") as handle:
                while chunk := handle.read(CHUNK):
                    conn.send(chunk)
        except (BrokenPipeError, ConnectionResetError) as exc:
            # The server stopped reading part way (a body over its limit without a
            # Content-Length it could check first): its answer may still be readable.
            try:
                raise _failure("POST", path, conn.getresponse()) from exc
            except (OSError, http.client.HTTPException):
                raise click.ClickException(
                    f"POST {path}: the server closed the connection during the upload of "
                    f"{size} bytes (over its max_import_bytes?)"
                ) from exc
        response = conn.getresponse()
        if response.status != 200:
            raise _failure("POST", path, response)
        return json.loads(response.read())
    except OSError as exc:
        raise click.ClickException(f"cannot reach the server at {url}: {exc}") from exc
    finally:
        conn.close()


def _may_send(conn: http.client.HTTPConnection) -> bool:
    """After ``Expect: 100-continue``: True once the server says go on (or says nothing in
    time, as a server that ignores the header does); False when it answered instead."""
    sock = conn.sock
    if sock is None or isinstance(sock, ssl.SSLSocket):  # no peeking under TLS: just send
        return True
    ready, _, _ = select.select([sock], [], [], CONTINUE_WAIT_S)
    if not ready:
        return True
    head = sock.recv(4096, socket.MSG_PEEK)
    if not head.startswith(b"HTTP/1.1 100") and not head.startswith(b"HTTP/1.0 100"):
        return False
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return True  # an interim answer split oddly: send, and let getresponse skip it
    sock.recv(end + 4)  # consume the interim answer; the final one follows the body
    return True
