"""TTFT of a ~2,000-token prefix across two omlx servers sharing one cold tier (docs/multi-machine.md).

    .venv/bin/python bench/shared_restore.py [--context-tokens 2000] [--max-tokens 8] [--json OUT]
                                             [--keep]

Starts a throw-away PostgreSQL server (tests/postgres.py) and two ``omlx serve``
processes, A and B (default SmolLM2 model), on one cache folder and one PostgreSQL
index. The prompt is bench/agent_loop.py's agent system prompt (tools + source files)
plus one user turn. Measured, in this order, each the first request of its kind:

1. A, cold: A recomputes the prefix (the recompute cost);
2. A again: A's own in-RAM hit (hot tier);
3. B, page cache dropped: B restores the prefix from the block files A wrote, found
   through the shared index (B's RAM is empty);
4. A restarted, page cache dropped: A's own restore from disk (a local restore).

One machine plays both hosts, so "the share" is a local ext4 folder: B's read costs a
local disk read, not a network one (docs/multi-machine.md gives the network estimates).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_prompt import build_system_prompt
from common import (
    ChatResult,
    drop_page_cache,
    ensure_mlx_lm_folder,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
)
from tokenizers import Tokenizer

from omlx.adapters.sqlindex import connect_index
from tests.postgres import PostgresServer, find_bindir

MODEL = "smollm2-135m-instruct"
USER = "Look at keys.py above. What exactly does block_key hash? Answer in one sentence."


def settle(url: str, quiet: float = 2.0, timeout: float = 300.0) -> int:
    """Rows in the index once it stops changing (A's writer has drained)."""
    index = connect_index(url, migrate=False)
    try:
        deadline, last, since = time.monotonic() + timeout, -1, time.monotonic()
        while time.monotonic() < deadline:
            now = index.block_count()
            if now != last:
                last, since = now, time.monotonic()
            elif now > 0 and time.monotonic() - since >= quiet:
                return now
            time.sleep(0.25)
        raise SystemExit(f"the index did not settle ({last} rows)")
    finally:
        index.close()


def measure(
    label: str, base_url: str, messages: list[dict[str, str]], max_tokens: int
) -> ChatResult:
    result = stream_chat(base_url, MODEL, messages, max_tokens)
    print(
        f"  {label}: TTFT {result.ttft:.3f} s, prompt {result.prompt_tokens}, "
        f"cached {result.cached_tokens}, reply {result.text[:60]!r}",
        flush=True,
    )
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = ensure_mlx_lm_folder()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    system, _ = build_system_prompt(tokenizer, args.context_tokens)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": USER}]
    bindir, why = find_bindir()
    if bindir is None:
        raise SystemExit(why)
    work = Path(tempfile.mkdtemp(prefix="omlx-shared-bench-", dir="/tmp"))
    cache = work / "shared-cache"
    print(f"{machine_note()}; load {load_average()}; work folder {work}", flush=True)
    with PostgresServer(bindir) as pg:
        url = pg.create_database()

        def server(name: str):
            extra = ["--index-url", url, "--server-id", name]
            return omlx_server(free_port(), cache, work / f"{name}.log", extra)

        a, b = server("a").start(), server("b").start()
        try:
            for s in (a, b):
                stream_chat(s.base_url, MODEL, [{"role": "user", "content": "Hi"}], 4)
            recompute = measure("A cold (recompute)", a.base_url, messages, args.max_tokens)
            rows = settle(url)
            print(f"  index: {rows} blocks after A's writes", flush=True)
            hot = measure("A again (A's RAM)", a.base_url, messages, args.max_tokens)
            dropped = drop_page_cache()
            shared = measure(
                "B (A's files via the shared index)", b.base_url, messages, args.max_tokens
            )
            a.stop()
            a = server("a").start()
            stream_chat(a.base_url, MODEL, [{"role": "user", "content": "Hi"}], 4)
            drop_page_cache()
            local = measure(
                "A restarted (its own disk restore)", a.base_url, messages, args.max_tokens
            )
        finally:
            a.stop()
            b.stop()
            if not args.keep:  # the servers' logs stay; the block files go
                shutil.rmtree(cache, ignore_errors=True)
    results = {"recompute": recompute, "a_hot": hot, "b_shared": shared, "a_restart": local}
    rows_out = [
        [name, f"{r.ttft:.3f}", r.prompt_tokens, r.cached_tokens, f"{recompute.ttft / r.ttft:.1f}x"]
        for name, r in results.items()
    ]
    print(table(["case", "TTFT s", "prompt", "cached", "vs recompute"], rows_out))
    print(f"page cache dropped before B and the restart: {dropped}; load {load_average()}")
    return {
        "machine": machine_note(),
        "load_end": load_average(),
        "page_cache_dropped": dropped,
        **{k: vars(v) for k, v in results.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the shared cache folder")
    args = parser.parse_args()
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
