"""Real HAProxy and nginx for the tests, run from the configurations shipped in docs/proxy/.

The files are the ones users copy: a test reads one, points it at its own servers' ports
(``render``) and runs the binary in the foreground from a folder of its own, as an
unprivileged user (``nobody`` when the tests run as root), never as the system service.
scripts/setup.sh installs Debian's packages; where a binary is missing, ``require`` and the
``proxy_kind`` fixture skip and say why.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.server_process import free_port

DOCS = Path(__file__).resolve().parents[1] / "docs" / "proxy"
KINDS = ("haproxy", "nginx")
CONFIG_FILE = {"haproxy": "haproxy.cfg", "nginx": "nginx.conf"}
# Debian puts both daemons in /usr/sbin, which an ordinary user's PATH may lack.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
UNPRIVILEGED = "nobody"
# What the shipped nginx.conf leaves to the distribution's defaults (/var/lib/nginx,
# /var/log/nginx): paths under the test's own folder, which its user may write.
_NGINX_HERE = (
    "    client_body_temp_path temp/body;\n"
    "    proxy_temp_path temp/proxy;\n"
    "    fastcgi_temp_path temp/fastcgi;\n"
    "    uwsgi_temp_path temp/uwsgi;\n"
    "    scgi_temp_path temp/scgi;\n"
    "    access_log logs/access.log;\n"
)


def binary(kind: str) -> str | None:
    return shutil.which(kind, path=_SEARCH_PATH)


def require(kind: str) -> str:
    """The path of ``kind``'s binary; skips the calling test where it is not installed."""
    found = binary(kind)
    if found is None:
        pytest.skip(
            f"{kind} is not installed (apt-get install {kind}; scripts/setup.sh does it "
            "where it may)"
        )
    return found


@pytest.fixture(params=KINDS)
def proxy_kind(request: pytest.FixtureRequest) -> str:
    """Each proxy in turn, skipped with the reason where its binary is missing."""
    require(request.param)
    return request.param


def _substitute(text: str, pattern: str, values: Sequence[str], what: str) -> str:
    """Replace the ``n``-th match's group 2 by ``values[n]``; one match per value, in order."""
    found = list(re.finditer(pattern, text, flags=re.M))
    if len(found) != len(values):
        raise ValueError(f"{what}: the shipped file has {len(found)}, the test gives {len(values)}")
    for match, value in reversed(list(zip(found, values, strict=True))):
        text = text[: match.start(2)] + value + text[match.end(2) :]
    return text


def render(kind: str, listen_port: int, backend_ports: Sequence[int]) -> str:
    """The shipped configuration, listening on ``listen_port``, its servers on ``backend_ports``."""
    text = (DOCS / CONFIG_FILE[kind]).read_text()
    backends = [f"127.0.0.1:{p}" for p in backend_ports]
    listen = f"127.0.0.1:{listen_port}"
    if kind == "haproxy":
        text = _substitute(text, r"^(\s*bind\s+)(\S+)", [listen], "bind lines")
        return _substitute(text, r"^(\s*server\s+\S+\s+)(\S+)", backends, "server lines")
    text = _substitute(text, r"^(\s*listen\s+)([^;\s]+)", [listen], "listen lines")
    text = _substitute(text, r"^(\s*server\s+)([\w.-]+:\d+)", backends, "upstream servers")
    return re.sub(r"^http \{\n", lambda m: m.group(0) + _NGINX_HERE, text, count=1, flags=re.M)


def _as_user() -> dict[str, object]:
    """Popen's arguments that drop root for the proxy (none when the tests are not root)."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(UNPRIVILEGED)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class Proxy:
    """One proxy process in the foreground: ``start()`` waits for its port, ``stop()`` ends it."""

    def __init__(self, kind: str, backend_ports: Sequence[int], log_path: Path) -> None:
        self.kind = kind
        self.exe = require(kind)
        self.port = free_port()
        self.config = render(kind, self.port, backend_ports)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        # Not under pytest's tmp folder, which only root may enter: the proxy's user must.
        self.folder = Path(tempfile.mkdtemp(prefix=f"omlx-{kind}-"))
        for sub in ("logs", "temp"):
            (self.folder / sub).mkdir()
        self.config_path = self.folder / CONFIG_FILE[kind]
        self.config_path.write_text(self.config)
        if os.geteuid() == 0:
            for path in (self.folder, self.folder / "logs", self.folder / "temp", self.config_path):
                shutil.chown(path, UNPRIVILEGED)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _argv(self, check: bool) -> list[str]:
        if self.kind == "haproxy":
            return [self.exe, "-c" if check else "-db", "-f", str(self.config_path)]
        globals_ = "pid nginx.pid;" if check else "daemon off; pid nginx.pid;"
        argv = [self.exe, "-p", str(self.folder), "-c", self.config_path.name, "-e", "stderr"]
        return [*argv, *(["-t"] if check else []), "-g", globals_]

    def check(self) -> subprocess.CompletedProcess[str]:
        """``haproxy -c`` / ``nginx -t`` on the rendered file: what each says of it."""
        return subprocess.run(
            self._argv(check=True), capture_output=True, text=True, timeout=30, **_as_user()
        )

    def start(self, timeout: float = 20.0) -> Proxy:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps its own descriptor
        with log:
            self.proc = subprocess.Popen(
                self._argv(check=False), stdout=log, stderr=subprocess.STDOUT, **_as_user()
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # its folder goes; its output stays in log_path
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.kind} did not open port {self.port}: {self.log()}")

    def wait_for_log(self, text: str, timeout: float = 15.0) -> None:
        """Until ``text`` appears in the proxy's output (a health check's verdict)."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.kind} never said {text!r}: {self.log()[-2000:]}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # both stop at once on SIGTERM
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
