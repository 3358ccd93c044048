"""Sub-agents started together on one long prefix (issue 38): each one's TTFT and cached tokens.

    .venv/bin/python bench/parallel_subagents.py [--context-tokens 7000] [--agents 2]
                                                 [--max-tokens 8] [--json OUT]

Starts one ``omlx serve`` (the default SmolLM2 model, a fresh cache folder) and sends
``--agents`` streaming chats at once, as Claude Code starts its sub-agents: one system
prompt of about ``--context-tokens`` tokens (bench/agent_prompt.py's tools and source
files), a different task each, none of it cached. Reported per request: TTFT, prompt and
cached tokens. The target: every request after the first restores >= 95% of the prefix
and has its first token no later than 1.2x the first's. Run it with ``PYTHONPATH`` at
another checkout's ``src`` to measure that checkout's server (the server inherits it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_prompt import build_system_prompt
from common import (
    ChatResult,
    ensure_mlx_lm_folder,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
)
from tokenizers import Tokenizer

MODEL = "smollm2-135m-instruct"
TASKS = [
    "Explore the tests folder and list what each test module covers.",
    "Review the cache code for places where a block could be read twice.",
    "Find every place the engine thread is started or stopped.",
    "Summarize how the scheduler decides which request joins the batch.",
]


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = ensure_mlx_lm_folder()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    system, _ = build_system_prompt(tokenizer, args.context_tokens)
    work = Path(tempfile.mkdtemp(prefix="omlx-subagents-bench-", dir="/tmp"))
    print(f"{machine_note()}; load {load_average()}; work folder {work}", flush=True)
    server = omlx_server(free_port(), work / "cache", work / "server.log").start()
    try:
        stream_chat(server.base_url, MODEL, [{"role": "user", "content": "Hi"}], 4)
        start = threading.Barrier(args.agents)

        def sub_agent(task: str) -> ChatResult:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
            start.wait()
            return stream_chat(server.base_url, MODEL, messages, args.max_tokens)

        with concurrent.futures.ThreadPoolExecutor(args.agents) as pool:
            results = list(pool.map(sub_agent, TASKS[: args.agents]))
    finally:
        server.stop()
        shutil.rmtree(work / "cache", ignore_errors=True)  # the log stays
    first = min(results, key=lambda r: r.ttft)
    rows = [
        [i + 1, f"{r.ttft:.3f}", f"{r.ttft / first.ttft:.2f}x", r.prompt_tokens, r.cached_tokens]
        for i, r in enumerate(sorted(results, key=lambda r: r.ttft))
    ]
    print(table(["request", "TTFT s", "vs first", "prompt", "cached"], rows))
    print(f"load {load_average()}; server log {work / 'server.log'}")
    return {
        "machine": machine_note(),
        "load_end": load_average(),
        "context_tokens": args.context_tokens,
        "results": [vars(r) for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--context-tokens", type=int, default=7000)
    parser.add_argument("--agents", type=int, default=2, choices=range(2, len(TASKS) + 1))
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
