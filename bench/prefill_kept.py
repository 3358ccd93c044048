"""What a client that leaves mid-prefill, and a server killed mid-prefill, keep (issue 10).

Three runs of one ~1,700-token chat prompt on the default model, each on a fresh cache:

- cold: the whole prefill, for reference (and the engine-thread time spent keeping
  blocks while it ran, from ``/metrics``);
- client timeout: a client that gives up after ``--timeout`` seconds, then a retry;
- kill -9: the server killed ``--kill-after`` seconds into the prefill, restarted, the
  request retried.

Each retry's ``cached_tokens`` is compared with how far the prefill had got (the engine's
log line for the cancelled request; for the crash, the KV rows that had reached the
index). Prints a table and writes ``bench/out/prefill_kept.json``.

    .venv/bin/python bench/prefill_kept.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ROOT,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
)

MODEL = "smollm2-135m-instruct"
OUT = ROOT / "bench" / "out"
WORK = Path("/tmp/omlx-bench/prefill-kept")


def messages(chars: int) -> list[dict[str, str]]:
    """A system prompt of this repository's own prose, about ``chars`` long, and a question."""
    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "api.md").read_text()
    return [
        {"role": "system", "content": text[:chars]},
        {"role": "user", "content": "Summarize the text above in one sentence."},
    ]


def metric(server, name: str) -> float:
    for line in httpx.get(server.base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def kv_rows(cache: Path) -> int:
    with sqlite3.connect(cache / "index.db") as db:
        return db.execute("SELECT COUNT(*) FROM blocks WHERE kind = 'kv'").fetchone()[0]


def fresh(name: str):
    work = WORK / name
    if work.exists():
        import shutil

        shutil.rmtree(work)
    return omlx_server(free_port(), work / "cache", work / "server.log"), work / "cache"


def run(args: argparse.Namespace) -> dict:
    msgs = messages(args.chars)
    result: dict = {"machine": machine_note(), "load_before": load_average()}

    server, _ = fresh("cold")
    with server:
        before = metric(server, "omlx_cache_store_seconds_total")
        cold = stream_chat(server.base_url, MODEL, msgs, max_tokens=8)
        kept_s = metric(server, "omlx_cache_store_seconds_total") - before
    result["cold"] = {"prompt": cold.prompt_tokens, "ttft_s": cold.ttft, "keep_blocks_s": kept_s}

    server, _ = fresh("timeout")
    with server:
        try:
            httpx.post(
                server.base_url + "/v1/chat/completions",
                json={"model": MODEL, "messages": msgs, "max_tokens": 8, "temperature": 0},
                timeout=args.timeout,
            )
            raise SystemExit("the prompt finished before the client timeout: use more --chars")
        except httpx.TimeoutException:
            pass
        time.sleep(1.0)
        log = server.log_path.read_text(errors="replace")
        found = re.findall(
            r"cancelled: prompt \d+ tokens, \d+ cached.*?prefill stopped at (\d+)", log
        )
        reached = int(found[-1]) if found else None
        retry = stream_chat(server.base_url, MODEL, msgs, max_tokens=8)
    result["client_timeout"] = {
        "timeout_s": args.timeout,
        "prefilled_when_the_client_left": reached,
        "retry_cached": retry.cached_tokens,
        "retry_ttft_s": retry.ttft,
    }

    server, cache = fresh("kill9")
    server.start()
    done = threading.Event()

    def ask() -> None:
        with contextlib.suppress(Exception):  # the server is killed under it
            stream_chat(server.base_url, MODEL, msgs, max_tokens=8, timeout=120)
        done.set()

    threading.Thread(target=ask, daemon=True).start()
    time.sleep(args.kill_after)
    if done.is_set():
        raise SystemExit("the prompt finished before the kill: use more --chars")
    server.kill()
    on_disk = kv_rows(cache)
    again = omlx_server(server.port, cache, server.log_path)
    with again:
        retry = stream_chat(again.base_url, MODEL, msgs, max_tokens=8)
    result["kill9"] = {
        "killed_after_s": args.kill_after,
        "kv_blocks_on_disk": on_disk,
        "tokens_on_disk": on_disk * 64,
        "retry_cached": retry.cached_tokens,
        "retry_ttft_s": retry.ttft,
    }
    result["load_after"] = load_average()
    return result


def report(r: dict) -> None:
    cold, to, k = r["cold"], r["client_timeout"], r["kill9"]
    print(f"machine: {r['machine']}; load {r['load_before']} -> {r['load_after']}")
    print(
        f"cold prefill of {cold['prompt']} tokens: TTFT {cold['ttft_s']:.2f} s; engine thread "
        f"keeping blocks meanwhile {cold['keep_blocks_s'] * 1000:.0f} ms "
        f"({100 * cold['keep_blocks_s'] / cold['ttft_s']:.2f}% of the prefill)"
    )
    print(
        table(
            ["probe", "work done before the loss", "retry cached", "retry TTFT"],
            [
                [
                    f"client timeout {to['timeout_s']:.0f} s",
                    f"{to['prefilled_when_the_client_left']} tokens prefilled",
                    to["retry_cached"],
                    f"{to['retry_ttft_s']:.2f} s",
                ],
                [
                    f"kill -9 at {k['killed_after_s']:.0f} s",
                    f"{k['tokens_on_disk']} tokens on disk ({k['kv_blocks_on_disk']} blocks)",
                    k["retry_cached"],
                    f"{k['retry_ttft_s']:.2f} s",
                ],
            ],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--chars", type=int, default=6500, help="system prompt length (~1,700 tokens)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="the client's timeout")
    parser.add_argument("--kill-after", type=float, default=7.0, help="seconds into the prefill")
    args = parser.parse_args()
    result = run(args)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "prefill_kept.json").write_text(json.dumps(result, indent=2))
    report(result)


if __name__ == "__main__":
    main()
