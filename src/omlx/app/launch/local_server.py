"""The omlx server an agent talks to: one already on the port, or one started and stopped here."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from omlx.app.launch.agent_settings import Endpoint

POLL_S = 0.2
STOP_WAIT_S = 60.0  # a clean stop flushes the cache writer's queue to disk first
# The key clients send to a server without one: any value works there.
NO_KEY = "omlx"


class LaunchError(Exception):
    """A mistake ``omlx launch`` reports as one line (the port, the key, the server's exit)."""


def probe(base_url: str) -> str | None:
    """ "omlx", "other" (something else holds the port), or None (nothing listens there)."""
    try:
        answer = httpx.get(base_url + "/health", timeout=5.0)
    except httpx.ConnectError:
        return None
    except httpx.HTTPError:  # it listens but does not answer HTTP as omlx does
        return "other"
    try:
        body = answer.json()
    except ValueError:
        return "other"
    return "omlx" if isinstance(body, dict) and body.get("server") == "omlx" else "other"


def wait_ready(base_url: str, alive=lambda: True) -> None:
    """Until /health says ready: the models named at start have loaded."""
    while True:
        if not alive():
            raise LaunchError("the server it started exited")
        try:
            if httpx.get(base_url + "/health", timeout=5.0).json().get("ready", True):
                return
        except (httpx.HTTPError, ValueError):
            pass  # not listening yet
        time.sleep(POLL_S)


def endpoint_of(base_url: str, api_key: str) -> Endpoint:
    """The model an agent gets: the first loaded chat model (the first ``--model``)."""
    key = api_key or NO_KEY
    answer = httpx.get(
        base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10.0
    )
    if answer.status_code == 401:
        raise LaunchError(
            f"the omlx on {base_url} wants an API key: pass --api-key or set OMLX_API_KEY"
        )
    answer.raise_for_status()
    cards = [
        c for c in answer.json()["data"] if c.get("task", "chat") == "chat" and "alias_of" not in c
    ]
    if not cards:
        raise LaunchError(f"the omlx on {base_url} serves no chat model")
    card = next((c for c in cards if c.get("state") == "loaded"), cards[0])
    return Endpoint(base_url, key, card["id"], card.get("context_length"))


@dataclass
class StartedServer:
    """``omlx serve`` in its own session (the terminal's Ctrl-C is the agent's, not its),
    its output in a log file rather than on the agent's screen."""

    proc: subprocess.Popen
    log_path: Path

    @classmethod
    def start(cls, serve_args: list[str], log_path: Path) -> StartedServer:
        log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # prompts, at debug
        with open(log_path, "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "omlx", "serve", *serve_args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(proc, log_path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        """SIGTERM: the server finishes its cache writes and exits; killed only if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
