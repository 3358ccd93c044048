"""The morning after: spawn -> the first token of yesterday's agent turn, replayed after a restart.

    .venv/bin/python bench/morning_after.py [--repeats 3] [--context-tokens 6000]

Yesterday: each peer that keeps a prompt cache across restarts (omlx; llama.cpp's server
with its disk prompt cache) answers an agent turn (``agent_prompt``: tool descriptions and
this repository's source, ``--context-tokens`` long, on the default model) and is stopped.
Then, per repeat and interleaved, the page cache dropped before each start: spawn, and send
the same turn at once, retrying while the port refuses; the time from the spawn to the first
token of the reply, and the first time the port answered its health path (a thread polls it
beside). ``mlx_lm.server`` keeps nothing across a restart: its *time to ready* is spawn ->
the first token of a one-word request (it answers /health before its model has loaded).
omlx runs with warm restart (the default) and, as a control, ``--no-warm-restart``.

Targets (issue 36): omlx <= 1.0x llama.cpp; omlx's time to ready (spawn -> /health
``ready``) <= 0.5x mlx_lm.server's; its port answers /health within 0.1x of that time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_prompt import USER_TURNS, build_system_prompt
from common import (
    Server,
    default_gguf,
    drop_page_cache,
    ensure_mlx_lm_folder,
    free_port,
    llama_cpp_python,
    llama_cpp_server,
    machine_note,
    mlx_lm_server,
    omlx_server,
    stream_chat,
    table,
)
from summary import write_json

PEERS = ("omlx", "omlx --no-warm-restart", "llama.cpp", "mlx_lm.server")
HI = [{"role": "user", "content": "Hi"}]


@dataclass
class Start:
    first_token_s: float  # spawn -> first token of the request sent at once
    port_s: float | None  # spawn -> the health path first answered (any status)
    ready_s: float | None  # spawn -> /health said ready (omlx only)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    tier: str = ""


@dataclass
class Watch:
    """Polls ``url`` from the spawn on: when it first answered, when it said ready."""

    url: str
    t0: float
    port_s: float | None = None
    ready_s: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set() and self.ready_s is None:
            try:
                r = httpx.get(self.url, timeout=1.0)
                now = time.perf_counter() - self.t0
                self.port_s = self.port_s if self.port_s is not None else now
                body = (
                    r.json()
                    if r.headers.get("content-type", "").startswith("application/json")
                    else {}
                )
                if r.status_code == 200 and isinstance(body, dict) and body.get("ready", True):
                    self.ready_s = now
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.01)


def timed_start(server: Server, model: str, messages: list[dict]) -> Start:
    """Spawn ``server`` and send ``messages`` at once (again while the port refuses)."""
    t0 = server.spawn()
    watch = Watch(server.base_url + server.ready_path, t0)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    try:
        while True:
            if server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} exited:\n{server.log_tail()}")
            sent = time.perf_counter()
            try:
                r = stream_chat(server.base_url, model, messages, 8)
                break
            except (httpx.ConnectError, httpx.RemoteProtocolError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        first = sent - t0 + r.ttft
        # Let the watcher see "ready" if it has not yet (it polls on).
        thread.join(timeout=5)
    finally:
        watch.stop.set()
    return Start(first, watch.port_s, watch.ready_s, r.prompt_tokens, r.cached_tokens)


def omlx_tier(log_path: Path) -> str:
    """The tier the last cache report in an omlx log names (``tier=hot|ssd|none``)."""
    tiers = [
        line.split("tier=", 1)[1].split(";", 1)[0]
        for line in log_path.read_text(errors="replace").splitlines()
        if "cache: cached=" in line and "tier=" in line
    ]
    return tiers[-1] if tiers else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context-tokens", type=int, default=6000)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    parser.add_argument(
        "--before-src",
        type=Path,
        default=None,
        help="another checkout's src: its omlx runs too, as 'omlx before' (its own cache folder)",
    )
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    if args.before_src is not None:
        peers.insert(1, "omlx before")
    if "llama.cpp" in peers and llama_cpp_python() is None:
        print("note: llama.cpp's server is not built (scripts/install-llama-cpp.sh): left out")
        peers.remove("llama.cpp")
    folder = ensure_mlx_lm_folder()
    gguf = default_gguf()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    system, _ = build_system_prompt(tokenizer, args.context_tokens)
    turn = [{"role": "system", "content": system}, {"role": "user", "content": USER_TURNS[0]}]
    work = Path(tempfile.mkdtemp(prefix="omlx-morning-"))
    omlx_cache = work / "omlx-cache"
    llama_home = work / "llama"

    def make(peer: str, name: str) -> Server:
        log = work / f"{name}.log"
        if peer == "omlx":
            return omlx_server(free_port(), omlx_cache, log)
        if peer == "omlx --no-warm-restart":
            return omlx_server(free_port(), omlx_cache, log, ["--no-warm-restart"])
        if peer == "omlx before":
            server = omlx_server(free_port(), work / "before-cache", log)
            server.env = {"PYTHONPATH": str(args.before_src)}
            return server
        if peer == "llama.cpp":
            return llama_cpp_server(free_port(), gguf, log, llama_home)
        return mlx_lm_server(free_port(), folder, log)

    def model_of(peer: str, server: Server) -> str:
        if peer == "mlx_lm.server":
            return str(folder)
        return "smollm2" if peer == "llama.cpp" else "smollm2-135m-instruct"

    # Yesterday: the turn computed once by the peers that keep it across a restart. omlx
    # is started twice more so its prepared weights copy exists, as on any later morning.
    for peer in [p for p in peers if p in ("omlx", "omlx before", "llama.cpp")]:
        with make(peer, f"yesterday-{peer}") as s:
            r = stream_chat(s.base_url, model_of(peer, s), turn, 8)
            print(f"yesterday {peer}: TTFT {r.ttft:.2f} s, prompt {r.prompt_tokens}", flush=True)
            s.wait_idle(quiet=0.05, window=2.0)
    starts: dict[str, list[Start]] = {p: [] for p in peers}
    for rep in range(args.repeats):
        for peer in peers:
            dropped = drop_page_cache()
            server = make(peer, f"{peer.replace(' ', '_')}-{rep}")
            try:
                messages = HI if peer == "mlx_lm.server" else turn
                start = timed_start(server, model_of(peer, server), messages)
                if peer.startswith("omlx"):
                    start.tier = omlx_tier(server.log_path)
                    server.wait_idle(quiet=0.05, window=1.0)  # its record and writes settle
            finally:
                server.stop()
            starts[peer].append(start)
            print(
                f"repeat {rep} {peer}: first token {start.first_token_s:.2f} s, port "
                f"{start.port_s if start.port_s is None else round(start.port_s, 2)} s, ready "
                f"{start.ready_s if start.ready_s is None else round(start.ready_s, 2)} s, "
                f"prompt {start.prompt_tokens} cached {start.cached_tokens} {start.tier}"
                + ("" if dropped else " (page cache not dropped)"),
                flush=True,
            )

    def med(peer: str, attr: str) -> float | None:
        values = [getattr(s, attr) for s in starts.get(peer, []) if getattr(s, attr) is not None]
        return statistics.median(values) if values else None

    rows = []
    for peer in peers:
        rows.append(
            [
                peer,
                f"{med(peer, 'first_token_s'):.2f}",
                "-" if med(peer, "port_s") is None else f"{med(peer, 'port_s'):.2f}",
                "-" if med(peer, "ready_s") is None else f"{med(peer, 'ready_s'):.2f}",
                " ".join(
                    f"{s.cached_tokens}/{s.prompt_tokens} {s.tier}".strip() for s in starts[peer]
                ),
            ]
        )
    print()
    print(machine_note())
    print(f"agent turn of {starts[peers[0]][0].prompt_tokens} tokens, medians of {args.repeats}")
    print(
        table(
            ["peer", "spawn -> first token s", "port answers s", "ready s", "cached/prompt"],
            rows,
        )
    )
    verdicts = []
    omlx_first = med("omlx", "first_token_s")
    if "llama.cpp" in peers:
        ratio = omlx_first / med("llama.cpp", "first_token_s")
        verdicts.append(
            f"first token vs llama.cpp: {ratio:.2f}x (target <= 1.0: {'met' if ratio <= 1.0 else 'missed'})"
        )
    if "mlx_lm.server" in peers:
        ready = med("omlx", "ready_s")
        mlx_ready = med("mlx_lm.server", "first_token_s")
        ratio = ready / mlx_ready
        verdicts.append(
            f"ready vs mlx_lm.server's time to ready: {ratio:.2f}x (target <= 0.5: "
            f"{'met' if ratio <= 0.5 else 'missed'})"
        )
        port = med("omlx", "port_s") / mlx_ready
        verdicts.append(
            f"port answers /health at {port:.2f}x of mlx_lm.server's time to ready (target <= 0.1: "
            f"{'met' if port <= 0.1 else 'missed'})"
        )
    for v in verdicts:
        print(v)
    result = {p: [s.__dict__ for s in v] for p, v in starts.items()}
    write_json("morning_after", result | {"verdicts": verdicts}, args.json)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"logs in {work}")


if __name__ == "__main__":
    main()
