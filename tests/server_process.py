"""A real ``omlx serve`` process on a free port, for end-to-end tests."""

from __future__ import annotations

import os
import random
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


def free_port(span: int = 0) -> int:
    """A loopback port free now, below the kernel's ephemeral range when it can be.

    A port the kernel hands out for ``bind(0)`` is one it also hands to outgoing
    connections; seconds later, when the server binds it, a client of PostgreSQL or
    SeaweedFS may hold it. ``span``: ``port + span`` must be free too (SeaweedFS puts
    its gRPC ports 10000 above).
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, max(10001, low - span))
        if all(_bindable(p) for p in {port, port + span}):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS's range starts at 49152


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _writer_state(base_url: str) -> tuple[float, float]:
    """(blocks queued for the shared tier, blocks written to it) from ``/metrics``."""
    samples = {}
    for line in httpx.get(base_url + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.rpartition(" ")
        samples[name] = value
    return (
        float(samples['omlx_cache_write_queue_blocks{model="all"}']),
        float(samples['omlx_cache_blocks_written_total{model="all",tier="ssd"}']),
    )


def wait_for_writes(base_urls: list[str], timeout: float = 60.0) -> float:
    """Until the servers' writers have put every queued block on disk; the seconds it took.

    Done when every queue is empty and no write finished over the last 0.1 s (the block a
    writer has taken off its queue is no longer counted there). An agent runs its tools
    between turns while the writer stores the last turn; a replay without that pause
    would race the writer (about 30 ms a block here: a file, an fsync, an index row)."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        state = [_writer_state(url) for url in base_urls]
        if state == last and all(queued == 0 for queued, _ in state):
            return time.monotonic() - t0
        last = state
        time.sleep(0.1)
    raise TimeoutError(f"the writers did not drain in {timeout} s: {last}")


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
