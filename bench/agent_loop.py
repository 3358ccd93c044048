"""A coding agent's conversation against omlx serve and mlx_lm.server: TTFT per turn, then a restart.

    .venv/bin/python bench/agent_loop.py [--turns 4] [--context-tokens 2000] [--max-tokens 16]
                                         [--skip-mlx-lm] [--json OUT]

The prompt is what an agent resends every turn: a system prompt with tool descriptions
and the text of a few of this repository's source files (``--context-tokens`` SmolLM2
tokens), then per turn one short user message and the previous assistant reply (greedy,
``--max-tokens``). omlx runs first (fresh ``--paged-ssd-cache-dir`` in a temp folder);
its replies become the history both servers see, so every prompt is the same bytes for
both. The servers run one after the other, never together. TTFT is measured by the
client: request sent -> first chunk with non-empty ``delta.content``.

Restart phase: SIGTERM the omlx server, start a new one on the same cache folder and
replay the last turn, next to a fresh mlx_lm.server computing the same prompt cold
(its first request) and then again from its in-process prompt cache (second request).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    MLX_LM_FOLDER,
    ROOT,
    ChatResult,
    Server,
    ensure_mlx_lm_folder,
    fmt_ratio,
    fmt_s,
    free_port,
    load_average,
    machine_note,
    mlx_lm_server,
    omlx_server,
    stream_chat,
    table,
)

CONTEXT_LIMIT = 8192  # SmolLM2-135M's max_position_embeddings

TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the repository and return its text with line numbers.",
        "parameters": {
            "path": "string, relative to the repository root",
            "start_line": "integer, optional",
            "end_line": "integer, optional",
        },
    },
    {
        "name": "write_file",
        "description": "Replace the whole content of a file; creates folders as needed.",
        "parameters": {"path": "string", "content": "string"},
    },
    {
        "name": "edit_file",
        "description": "Replace one exact, unique occurrence of old_text by new_text in a file.",
        "parameters": {"path": "string", "old_text": "string", "new_text": "string"},
    },
    {
        "name": "grep",
        "description": "Search files for a regular expression; returns path:line:text matches.",
        "parameters": {
            "pattern": "string",
            "path": "string, a folder or file",
            "max_results": "integer",
        },
    },
    {
        "name": "run_tests",
        "description": "Run pytest on a path and return the summary and the first failures.",
        "parameters": {"path": "string", "keyword": "string, optional -k expression"},
    },
    {
        "name": "run_shell",
        "description": "Run a shell command in the repository root with a 60 s timeout.",
        "parameters": {"command": "string"},
    },
]

SOURCE_FILES = [
    "src/omlx/domain/keys.py",
    "src/omlx/domain/blocks.py",
    "src/omlx/domain/ports.py",
    "src/omlx/domain/prefix_cache.py",
    "src/omlx/domain/hot_tier.py",
    "src/omlx/domain/eviction.py",
    "src/omlx/domain/cold_tier.py",
    "src/omlx/adapters/mlx/kv_codec.py",
    "src/omlx/adapters/blockfiles/format.py",
    "src/omlx/adapters/blockfiles/store.py",
]

USER_TURNS = [
    "Look at keys.py above. What exactly does block_key hash? Answer in one sentence.",
    "Call read_file on src/omlx/domain/blocks.py. Reply with the tool call as JSON only.",
    "Tool result: 70 lines; dataclasses NamespaceInfo, BlockMeta, StoredBlock, DecodedBlock. Which one is an index row?",
    "Call run_tests with path tests/unit. Reply with the tool call as JSON only.",
    "Tool result: 212 passed in 3.1 s. Summarize the state of the work in one line.",
    "Call grep for 'def lookup' in src/omlx/domain. Reply with the tool call as JSON only.",
    "Tool result: src/omlx/domain/prefix_cache.py:104:    def lookup(self, tokens). What does it return?",
    "Call edit_file to add a docstring to PrefixCache.lookup. Reply with the tool call as JSON only.",
]

SYSTEM_HEAD = (
    "You are a coding agent working in the omlx repository, a local LLM server on MLX with a "
    "prefix KV cache in RAM and on disk. Answer briefly. To act, reply with exactly one tool "
    'call as a JSON object {"tool": NAME, "arguments": {...}}.\n\n# Tools\n'
)


def build_system_prompt(tokenizer: Tokenizer, context_tokens: int) -> tuple[str, list[str]]:
    """Tool descriptions plus whole lines of source files, up to about ``context_tokens`` tokens."""
    text = SYSTEM_HEAD + "\n".join(json.dumps(t) for t in TOOLS) + "\n\n# Files of the repository\n"
    budget = context_tokens - 40  # room for the chat template and the first user message
    used_files: list[str] = []

    def count(s: str) -> int:
        return len(tokenizer.encode(s, add_special_tokens=False).ids)

    if count(text) >= budget:
        raise SystemExit(f"--context-tokens {context_tokens} is below the tool descriptions alone")
    files = SOURCE_FILES + sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "src/omlx").rglob("*.py")
        if str(p.relative_to(ROOT)) not in SOURCE_FILES
    )
    for rel in files:
        path = ROOT / rel
        if not path.exists():
            continue
        header = f"\n## {rel}\n```python\n"
        if count(text + header) >= budget:
            break
        used_files.append(rel)
        text += header
        # Whole lines while they fit; counting the growing text keeps merges at the seams exact.
        lines = path.read_text().splitlines(keepends=True)
        lo, hi = 0, len(lines)  # largest prefix of lines that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(text + "".join(lines[:mid]) + "```\n") <= budget:
                lo = mid
            else:
                hi = mid - 1
        text += "".join(lines[:lo]) + "```\n"
        if lo < len(lines):
            break
    return text, used_files


def model_id(server: Server) -> str:
    return httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]


def health(server: Server) -> dict[str, Any]:
    try:
        return httpx.get(server.base_url + "/health", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": str(exc)}


def show(label: str, r: ChatResult) -> None:
    print(
        f"  {label}: TTFT {r.ttft:.3f} s, total {r.total:.3f} s, prompt {r.prompt_tokens} tokens, "
        f"cached {r.cached_tokens}, reply {r.text!r}",
        flush=True,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = ensure_mlx_lm_folder(Path(args.mlx_lm_model))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    system, used_files = build_system_prompt(tokenizer, args.context_tokens)
    user_turns = [USER_TURNS[i % len(USER_TURNS)] for i in range(args.turns)]
    worst = (
        len(tokenizer.encode(system).ids)
        + sum(len(tokenizer.encode(u).ids) + 12 + args.max_tokens for u in user_turns)
        + 20
    )
    if worst > CONTEXT_LIMIT - 64:
        raise SystemExit(
            f"about {worst} tokens by the last turn: over the model's {CONTEXT_LIMIT}-token context"
        )

    workdir = Path(tempfile.mkdtemp(prefix="omlx-agent-bench-"))
    cache_dir = workdir / "cache"
    result: dict[str, Any] = {
        "machine": machine_note(),
        "args": vars(args),
        "context": {
            "files": used_files,
            "sha256": hashlib.sha256(system.encode()).hexdigest()[:16],
        },
        "workdir": str(workdir),
    }
    result["load_average_start"] = load_average()
    print(f"machine: {result['machine']}; load average {result['load_average_start']}")
    print(
        f"context: {len(tokenizer.encode(system).ids)} tokens of system prompt ({len(used_files)} files: {', '.join(used_files)})"
    )
    print(f"omlx cache folder: {cache_dir}; logs in {workdir}", flush=True)

    servers: list[Server] = []

    def start(server: Server) -> Server:
        servers.append(server)
        print(f"starting {server.name} on port {server.port} ...", flush=True)
        server.start()
        print(f"  up in {server.started_s:.1f} s (health), idle after start-up", flush=True)
        return server

    def stop(server: Server) -> None:
        code = server.stop()
        print(
            f"  {server.name} stopped (SIGTERM) in {server.stop_s:.1f} s, exit code {code}",
            flush=True,
        )

    warmup = [{"role": "user", "content": "Hi"}]
    prompts: list[list[dict[str, str]]] = []
    omlx_turns: list[ChatResult] = []
    try:
        # ---- omlx: the conversation -------------------------------------------------
        a = start(omlx_server(free_port(), cache_dir, workdir / "omlx-1.log", args.omlx_arg))
        omlx_model = model_id(a)
        show("warm-up (short prompt, not cached)", stream_chat(a.base_url, omlx_model, warmup, 1))
        messages = [{"role": "system", "content": system}]
        for i, user in enumerate(user_turns, 1):
            messages.append({"role": "user", "content": user})
            prompts.append([dict(m) for m in messages])
            r = stream_chat(a.base_url, omlx_model, messages, args.max_tokens)
            omlx_turns.append(r)
            show(f"omlx turn {i}", r)
            messages.append({"role": "assistant", "content": r.text})
        repeat = stream_chat(a.base_url, omlx_model, prompts[-1], args.max_tokens)
        show("omlx last turn again, same process", repeat)
        result["omlx_health_before_restart"] = health(a)
        stop(a)

        # ---- omlx: restart on the same cache folder -----------------------------------
        b = start(omlx_server(free_port(), cache_dir, workdir / "omlx-2.log", args.omlx_arg))
        result["omlx_health_after_restart"] = health(b)
        replay = stream_chat(b.base_url, omlx_model, prompts[-1], args.max_tokens)
        show("omlx last turn after restart (first request)", replay)
        stop(b)

        # ---- mlx_lm.server: the same prompts ------------------------------------------
        mlx_turns: list[ChatResult] = []
        mlx_cold = mlx_hit = None
        if not args.skip_mlx_lm:
            c = start(mlx_lm_server(free_port(), folder, workdir / "mlx_lm-1.log", args.mlx_lm_arg))
            mlx_model = str(folder)
            show("warm-up (short prompt)", stream_chat(c.base_url, mlx_model, warmup, 1))
            for i, prompt in enumerate(prompts, 1):
                r = stream_chat(c.base_url, mlx_model, prompt, args.max_tokens)
                mlx_turns.append(r)
                show(f"mlx_lm.server turn {i}", r)
            stop(c)
            d = start(mlx_lm_server(free_port(), folder, workdir / "mlx_lm-2.log", args.mlx_lm_arg))
            mlx_cold = stream_chat(d.base_url, mlx_model, prompts[-1], args.max_tokens)
            show("mlx_lm.server last turn, fresh process (first request)", mlx_cold)
            mlx_hit = stream_chat(d.base_url, mlx_model, prompts[-1], args.max_tokens)
            show("mlx_lm.server last turn again, same process", mlx_hit)
            stop(d)
    finally:
        for server in servers:
            server.kill()

    result["turns"] = [
        {"turn": i, "omlx": asdict(o), "mlx_lm": asdict(m) if m else None}
        for i, (o, m) in enumerate(
            zip(omlx_turns, mlx_turns or [None] * len(omlx_turns), strict=True), 1
        )
    ]
    result["restart"] = {
        "omlx_same_process_repeat": asdict(repeat),
        "omlx_after_restart": asdict(replay),
        "mlx_lm_fresh_process": asdict(mlx_cold) if mlx_cold else None,
        "mlx_lm_in_process_hit": asdict(mlx_hit) if mlx_hit else None,
    }
    result["load_average_end"] = load_average()
    print(
        f"\nload average at the end: {result['load_average_end']} (2 cores; other work on the machine inflates TTFTs unevenly)"
    )
    report(result, omlx_turns, mlx_turns, repeat, replay, mlx_cold, mlx_hit)
    if args.keep:
        print(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def report(result, omlx_turns, mlx_turns, repeat, replay, mlx_cold, mlx_hit) -> None:
    rows = []
    for i, o in enumerate(omlx_turns):
        m = mlx_turns[i] if mlx_turns else None
        prompt = (
            o.prompt_tokens
            if m is None or m.prompt_tokens == o.prompt_tokens
            else f"{o.prompt_tokens} / {m.prompt_tokens}"
        )
        rows.append(
            [
                i + 1,
                prompt,
                fmt_s(o.ttft),
                fmt_s(m.ttft if m else None),
                fmt_ratio(o.ttft, m.ttft if m else None),
                o.cached_tokens,
                m.cached_tokens if m else "-",
                "yes" if m and m.text == o.text else ("-" if m is None else "no"),
            ]
        )
    print("\nMulti-turn (TTFT from the client; ratio = omlx / mlx_lm.server, lower is better)")
    print(
        table(
            [
                "turn",
                "prompt tokens",
                "omlx TTFT",
                "mlx_lm.server TTFT",
                "ratio",
                "omlx cached_tokens",
                "mlx_lm cached_tokens",
                "same reply",
            ],
            rows,
        )
    )

    print("\nRestart phase (the last turn's prompt)")
    rrows = [
        ["omlx, same process, repeat", fmt_s(repeat.ttft), repeat.cached_tokens],
        [
            "omlx, new process on the same cache folder (first request)",
            fmt_s(replay.ttft),
            replay.cached_tokens,
        ],
        [
            "mlx_lm.server, fresh process (first request: recompute)",
            fmt_s(mlx_cold.ttft if mlx_cold else None),
            mlx_cold.cached_tokens if mlx_cold else "-",
        ],
        [
            "mlx_lm.server, same process, second request (in-RAM hit)",
            fmt_s(mlx_hit.ttft if mlx_hit else None),
            mlx_hit.cached_tokens if mlx_hit else "-",
        ],
    ]
    print(table(["what", "TTFT", "cached_tokens"], rrows))

    verdicts = []
    if mlx_turns:
        cold = omlx_turns[0].ttft / mlx_turns[0].ttft
        verdicts.append(
            f"cold turn 1: {cold:.2f}x (target <= 1.05x) {'MET' if cold <= 1.05 else 'MISSED'}"
        )
        follow = [o.ttft / m.ttft for o, m in zip(omlx_turns[1:], mlx_turns[1:], strict=True)]
        if follow:
            worst = max(follow)
            verdicts.append(
                f"follow-up turns: worst {worst:.2f}x, each {', '.join(f'{f:.2f}x' for f in follow)} "
                f"(target <= 1.0x) {'MET' if worst <= 1.0 else 'MISSED'}"
            )
        if mlx_hit and mlx_cold:
            r = replay.ttft / mlx_hit.ttft
            verdicts.append(
                f"after restart: omlx {replay.ttft:.3f} s = {r:.2f}x mlx_lm.server's in-process hit "
                f"({mlx_hit.ttft:.3f} s; target <= 1.0x) {'MET' if r <= 1.0 else 'MISSED'}; "
                f"{replay.ttft / mlx_cold.ttft:.2f}x mlx_lm.server recomputing cold ({mlx_cold.ttft:.3f} s)"
            )
    if not replay.cached_tokens:
        verdicts.append(
            "note: omlx restored 0 cached tokens after the restart: the SSD tier did not serve this "
            f"prompt (health after restart: cache {result.get('omlx_health_after_restart', {}).get('cache')})"
        )
    result["verdicts"] = verdicts
    print("\n" + "\n".join(verdicts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=2000,
        help="SmolLM2 tokens of the shared system prompt",
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--skip-mlx-lm", action="store_true", help="omlx only (no peer numbers)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--mlx-lm-model",
        default=str(MLX_LM_FOLDER),
        help="mlx-lm folder of the default GGUF (made with omlx convert when missing)",
    )
    parser.add_argument(
        "--omlx-arg", action="append", default=[], help="extra argument for omlx serve (repeatable)"
    )
    parser.add_argument(
        "--mlx-lm-arg",
        action="append",
        default=[],
        help="extra argument for mlx_lm.server (repeatable)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temp folder (cache, server logs)"
    )
    args = parser.parse_args()
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    t0 = time.perf_counter()
    result = run(args)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
