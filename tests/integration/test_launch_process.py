"""``omlx launch``'s process edges: the agent's exit status, a port held by another program."""

from __future__ import annotations

import http.server
import os
import sys
import threading
from pathlib import Path

import pytest

import omlx.app.launch.command as command
from omlx.app.launch.command import LaunchPlan, launch, run_attached
from omlx.app.launch.local_server import probe
from tests.server_process import free_port


def test_the_agent_s_exit_status_is_passed_back():
    assert run_attached([sys.executable, "-c", "import sys; sys.exit(7)"], dict(os.environ)) == 7


def test_an_agent_killed_by_a_signal_exits_as_a_shell_reports_it():
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert run_attached([sys.executable, "-c", kill_self], dict(os.environ)) == 128 + 15


@pytest.fixture
def other_http_server():
    """A web server that is not omlx, on a free port."""

    class NotOmlx(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", free_port()), NotOmlx)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_port_held_by_something_else_is_one_line_and_nothing_starts(
    other_http_server, tmp_path, monkeypatch
):
    port = other_http_server
    assert probe(f"http://127.0.0.1:{port}") == "other"
    assert probe(f"http://127.0.0.1:{free_port()}") is None
    monkeypatch.setattr(command, "find_agent", lambda *a: Path(sys.executable))
    said: list[str] = []
    plan = LaunchPlan("claude", ("-p", "hi"), "127.0.0.1", port, "", (), tmp_path)
    assert launch(plan, said.append) == 2
    assert said == [
        f"127.0.0.1:{port} is held by something that is not omlx; "
        "pass --port to start omlx on another port"
    ]
    assert not (tmp_path / "logs").exists()  # no server was started
