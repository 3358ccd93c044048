"""A reverse proxy that records each request an agent CLI makes and the answer it got.

Claude Code talks to the proxy as its ``ANTHROPIC_BASE_URL``; the proxy forwards every
request to the server as it came and streams the answer back as it comes, keeping the
request's body, the answer's bytes and when each began and ended. The test reads what
the agent really sent from it (the server keeps no prompts).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from tests.server_process import free_port

_HOP_BY_HOP = {"connection", "content-length", "transfer-encoding", "keep-alive", "host"}
_NOT_PASSED = _HOP_BY_HOP | {"accept-encoding", "content-encoding"}  # answers pass decoded


@dataclass
class Exchange:
    """One request and its answer, in the order the requests arrived."""

    seq: int
    method: str
    path: str
    body: bytes
    started: float  # time.monotonic() when the request arrived
    status: int = 0
    answer: bytearray = field(default_factory=bytearray)
    ended: float | None = None

    def request_json(self) -> dict:
        return json.loads(self.body)

    def events(self) -> list[dict]:
        """The answer's server-sent events' data, parsed (an unstreamed answer: its JSON)."""
        text = self.answer.decode("utf-8", errors="replace")
        if not text.lstrip().startswith(("event:", "data:", ":")):
            return [json.loads(text)] if text.strip() else []
        return [
            json.loads(line[5:])
            for line in text.splitlines()
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]")
        ]


class RecordingProxy:
    """``with RecordingProxy(upstream) as proxy``: ``proxy.base_url`` forwards to ``upstream``
    (which may be changed between requests: a restarted server on a new port)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _record(self, method: str, path: str, body: bytes) -> Exchange:
        with self._lock:
            exchange = Exchange(len(self.exchanges), method, path, body, time.monotonic())
            self.exchanges.append(exchange)
        return exchange

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                exchange = proxy._record(self.command, self.path, body)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_PASSED}
                with (
                    httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0)) as client,
                    client.stream(
                        self.command, proxy.upstream + self.path, content=body, headers=headers
                    ) as answer,
                ):
                    exchange.status = answer.status_code
                    self.send_response(answer.status_code)
                    for k, v in answer.headers.items():
                        if k.lower() not in _NOT_PASSED:
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in answer.iter_bytes():
                        exchange.answer += chunk
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                exchange.ended = time.monotonic()

            do_GET = do_POST = _forward

            def log_message(self, format: str, *args: object) -> None:
                pass  # the server's own access log says it

        return Handler


def save(exchanges: list[Exchange], path) -> None:
    """The exchanges as JSON lines (bodies and answers as text), to read after a failure."""
    with open(path, "w", encoding="utf-8") as out:
        for e in exchanges:
            row = {
                "seq": e.seq,
                "method": e.method,
                "path": e.path,
                "status": e.status,
                "started": e.started,
                "ended": e.ended,
                "body": e.body.decode("utf-8", errors="replace"),
                "answer": e.answer.decode("utf-8", errors="replace"),
            }
            out.write(json.dumps(row) + "\n")
