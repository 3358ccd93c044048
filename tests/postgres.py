"""A real, throw-away PostgreSQL server for the tests: ``initdb`` + ``pg_ctl`` on a local port.

initdb refuses to run as root, so as root the cluster belongs to an unprivileged user
(Debian's ``postgres``, or ``omlx-pg`` created here). ``scripts/setup-test.sh`` installs the
server where apt can; where no server binaries exist, :func:`find_bindir` says why and
the tests that need one skip with that reason.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.server_process import free_port

USER = "omlx"  # the database superuser initdb creates
_DB_NAMES = itertools.count()


def find_bindir() -> tuple[Path | None, str]:
    """The folder holding ``initdb`` and ``pg_ctl``, or None and the reason."""
    if explicit := os.environ.get("OMLX_PG_BINDIR"):
        return Path(explicit), ""
    candidates = (
        sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda p: int(p.parent.name),
            reverse=True,
        )
        if Path("/usr/lib/postgresql").is_dir()
        else []
    )
    if on_path := shutil.which("initdb"):  # Homebrew, Postgres.app
        candidates.append(Path(on_path).parent)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder, ""
    return None, (
        "PostgreSQL server binaries not found (no initdb under /usr/lib/postgresql/*/bin or on "
        "PATH): scripts/setup-test.sh installs Debian's postgresql package where apt is usable"
    )


def _run_as() -> list[str]:
    """The command prefix that runs the server as an unprivileged user ([] when not root)."""
    if os.geteuid() != 0:
        return []
    for name in ("postgres", "omlx-pg"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return ["runuser", "-u", name, "--"]
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "omlx-pg"],
        check=True,
        capture_output=True,
    )
    return ["runuser", "-u", "omlx-pg", "--"]


class PostgresServer:
    """One cluster in a temporary folder; ``start``/``stop`` may be called again (outage tests)."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self._as = _run_as()
        # Not under pytest's root-only tmp folder: the server's user must reach it.
        self.root = Path(tempfile.mkdtemp(prefix="omlx-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self._as:
            user = self._as[2]
            shutil.chown(self.root, user)
        self.running = False
        self._pg(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def _pg(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self._as, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
        return proc

    def start(self) -> PostgresServer:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._pg(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        self.running = True
        return self

    def stop(self) -> None:
        if self.running:
            self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.running = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        """A new, empty database; returns its SQLAlchemy URL."""
        name = f"t{os.getpid()}_{next(_DB_NAMES)}"
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with contextlib.suppress(Exception):  # a test that stopped the server leaves it be
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
