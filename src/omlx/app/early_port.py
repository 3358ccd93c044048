"""The port answers from the moment it is bound, before the HTTP app is even imported.

``omlx serve`` binds its port first; importing the web stack, opening the cache index and
wiring the app take most of a second more, and a load balancer or ``omlx launch`` asking
``/health`` meanwhile would see a refused connection. ``EarlyPort`` listens at once and,
on a thread, answers ``GET /health`` itself (200, ``"ready": false`` and what the server is
waiting for, ``domain.startup``). Any other request is held, not refused: when the app is
about to serve (``hand_over``), each held connection is piped, bytes as they were sent, to
the app on the same port, so an agent's first request simply waits for it. (The app sees
those few connections come from this process: nothing in omlx trusts a client address.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_HEAD_LIMIT = 64 * 1024
_READ_TIMEOUT_S = 10.0


class EarlyPort:
    def __init__(self, listener: socket.socket, waiting_for: Callable[[], list[str]]) -> None:
        self._listener = listener
        self._waiting_for = waiting_for
        self._stop = threading.Event()
        self._held: list[tuple[socket.socket, bytes]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="omlx-early-port", daemon=True)

    def start(self) -> EarlyPort:
        self._listener.listen(2048)  # as uvicorn's backlog: it listens on this very socket
        self._thread.start()
        return self

    def hand_over(self, address: tuple) -> None:
        """Stop answering and pipe the held connections to the app at ``address``."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            held, self._held = self._held, []
        for client, head in held:
            threading.Thread(
                target=_pipe, args=(client, head, address), name="omlx-early-pipe", daemon=True
            ).start()
        if held:
            log.info("%d request(s) that came before the app was up go to it now", len(held))

    def _accept(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._listener], [], [], 0.05)
            if not ready or self._stop.is_set():
                continue
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(client,), name="omlx-early-request", daemon=True
            ).start()

    def _serve(self, client: socket.socket) -> None:
        head = b""
        client.settimeout(_READ_TIMEOUT_S)
        try:
            while b"\r\n\r\n" not in head and len(head) < _HEAD_LIMIT:
                chunk = client.recv(4096)
                if not chunk:
                    client.close()
                    return
                head += chunk
        except OSError:
            client.close()
            return
        client.settimeout(None)
        request_line = head.split(b"\r\n", 1)[0].split()
        target = request_line[1].split(b"?", 1)[0] if len(request_line) >= 2 else b""
        if request_line[:1] == [b"GET"] and target == b"/health" and not self._stop.is_set():
            body = json.dumps(
                {
                    "status": "ok",
                    "server": "omlx",  # as the app's answers: omlx launch tells omlx by it
                    "ready": False,
                    "waiting_for": self._waiting_for(),
                }
            ).encode()
            client.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
            client.close()
            return
        with self._lock:
            self._held.append((client, head))
        if self._stop.is_set():  # handed over meanwhile: hand_over saw the list before us
            with self._lock:
                if (client, head) in self._held:
                    self._held.remove((client, head))
                    threading.Thread(
                        target=_pipe, args=(client, head, self._address()), daemon=True
                    ).start()

    def _address(self) -> tuple:
        return self._listener.getsockname()


def _pipe(client: socket.socket, head: bytes, address: tuple) -> None:
    """Send ``head`` and everything after it to ``address``; its answers back to ``client``."""
    host = address[0]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        upstream = socket.create_connection((host, address[1]))
    except OSError:
        client.close()
        return
    upstream.sendall(head)

    def copy(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=copy, args=(upstream, client), daemon=True)
    back.start()
    copy(client, upstream)
    back.join()
    client.close()
    upstream.close()
