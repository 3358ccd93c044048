"""The port answers /health from the moment it is bound, and holds other requests for the
app: real sockets, a real HTTP client, a real HTTP server taking over the same socket."""

from __future__ import annotations

import http.server
import json
import threading
import time

import httpx

from omlx.app.early_port import EarlyPort
from omlx.app.server import bind_listener
from omlx.domain.startup import StartupSteps


class _App(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        reply = json.dumps({"echo": json.loads(body), "path": self.path}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


def test_health_answers_before_the_app_and_a_request_waits_for_it():
    steps = StartupSteps()
    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    early = EarlyPort(listener, steps.waiting_for).start()
    base = f"http://127.0.0.1:{port}"
    with steps.step("importing the HTTP app"):
        health = httpx.get(base + "/health", timeout=5)
        assert health.status_code == 200
        body = health.json()
        assert body["ready"] is False
        assert body["waiting_for"][0].startswith("importing the HTTP app (")

        # A request sent now is held, not refused: it gets the app's answer later.
        answers: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: answers.append(
                httpx.post(base + "/v1/chat/completions", json={"n": 1}, timeout=10)
            )
        )
        sender.start()
        time.sleep(0.3)
        assert not answers  # still waiting

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _App, bind_and_activate=False)
    server.socket.close()
    server.socket = listener  # the app serves the very socket the early port listened on
    early.hand_over(listener.getsockname())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sender.join(timeout=10)
        assert answers and answers[0].status_code == 200
        assert answers[0].json() == {"echo": {"n": 1}, "path": "/v1/chat/completions"}
        # After the hand-over the app answers everything, /health included.
        assert httpx.post(base + "/health", json={"n": 2}, timeout=5).json()["path"] == "/health"
    finally:
        server.shutdown()
        listener.close()


def test_a_client_that_hangs_up_early_leaves_nothing_behind():
    listener = bind_listener("127.0.0.1", 0)
    early = EarlyPort(listener, lambda: []).start()
    port = listener.getsockname()[1]
    import socket

    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /hea")  # a partial head, then gone
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
    early.hand_over(listener.getsockname())
    listener.close()
