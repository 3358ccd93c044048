"""A real ``omlx serve`` process on a free port, for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

# Every server spawned and not yet reaped: the session's end stops them all at once.
_spawned: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Start with ``start()``; ``stop()`` sends SIGTERM (or ``kill()`` for SIGKILL)."""

    def __init__(
        self,
        *args: str,
        cache_dir: Path | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.args = list(args)
        self.cache_dir = cache_dir
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._terminated = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> ServerProcess:
        """Launch the process and return at once (``wait_ready`` waits for it)."""
        cmd = [sys.executable, "-m", "omlx", "serve", "--port", str(self.port), *self.args]
        if self.cache_dir is not None:
            cmd += ["--paged-ssd-cache-dir", str(self.cache_dir)]
        # Kept open for the life of the process; closed in stop()/kill().
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        self._terminated = False
        _spawned.add(self)
        return self

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"omlx serve exited with {self.proc.returncode}: {self.read_log()[-3000:]}"
                )
            try:
                health = httpx.get(self.base_url + "/health", timeout=1.0)
                # The port opens before the models named at start have loaded: wait for them.
                if health.status_code == 200 and health.json().get("ready", True):
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            # Not shorter: the early port answers on a thread of the starting server, and
            # polling at 50 ms made a start ~0.2 s slower here (1.79 s vs 1.58 s, medians).
            time.sleep(0.2)
        self.kill()
        raise TimeoutError(f"omlx serve did not answer in {timeout}s: {self.read_log()[-3000:]}")

    def read_log(self) -> str:
        return (
            self.log_path.read_text(errors="replace")
            if self.log_path and self.log_path.exists()
            else ""
        )

    def log_once_it_has(self, text: str, timeout: float = 10.0) -> str:
        """The log once ``text`` is in it (or when ``timeout`` passes): a request's summary
        line is written just after its client has the answer, so a test reading the log
        at once can miss it."""
        deadline = time.monotonic() + timeout
        log = self.read_log()
        while text not in log and time.monotonic() < deadline:
            time.sleep(0.05)
            log = self.read_log()
        return log

    def terminate(self) -> None:
        """Send SIGTERM once and return at once (``stop`` waits for the exit)."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def terminate_all() -> None:
    """SIGTERM every server still running, without waiting (each owner's ``stop`` does)."""
    for server in list(_spawned):
        server.terminate()


@contextmanager
def side_by_side(*servers: ServerProcess, timeout: float = 120.0) -> Iterator[None]:
    """Start independent ``servers`` at once and stop them at once: their imports, model loads
    and shutdowns overlap, so two cost little more than one. Only for servers that share
    nothing a test's order of events depends on (not two on one cache folder)."""
    try:
        for server in servers:
            server.spawn()
        for server in servers:
            server.wait_ready(timeout)
        yield
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.stop()
