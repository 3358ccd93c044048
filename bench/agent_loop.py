"""A coding agent's conversation against omlx, mlx_lm.server and llama.cpp: TTFT per turn, restarts.

    .venv/bin/python bench/agent_loop.py [--repeats 3] [--turns 4] [--context-tokens 2000]
                                         [--max-tokens 16] [--peers omlx,mlx_lm.server,llama.cpp]
                                         [--json OUT] [--keep]

The prompt is what an agent resends every turn: a system prompt with tool descriptions
and whole lines of this repository's source (``--context-tokens`` SmolLM2 tokens), then
per turn one short user message and the server's own previous reply (greedy,
``--max-tokens``), as a live agent would. One *trial* of a peer, on a fresh cache:

1. start the server and send one short request as soon as it says it is up (process
   spawned -> that request's first token: "first start on a new cache folder"), wait
   until it is idle;
2. turn 1 (cold), turns 2.. (follow-ups);
3. same context, new question: the system prompt and another first question;
4. replay: the last turn's prompt again, same process;
5. SIGTERM, start again on the same cache folder, the last turn's prompt as its first
   request (mlx_lm.server keeps nothing: it recomputes). Before the SIGTERM, omlx's
   float32 copy of the GGUF (written when the server is quiet) is waited for;
6. SIGTERM, start a third time and time a short request as in 1: "server start-up", the
   start a user meets every day (omlx with its copy; mlx_lm.server reads the folder
   converted once before the trials).

Trials run one server at a time, interleaved: omlx, mlx_lm.server, llama.cpp, then the
other way round, ``--repeats`` times. Tables give medians and min-max; ratios are omlx's
median over the peer's. TTFT is measured by the client: request sent -> first chunk with
non-empty ``delta.content``. Writes ``bench/out/agent_loop.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from omlx.adapters.mlx.models.prepared_folder import PREPARED_DIR, list_copies

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots
from agent_prompt import USER_TURNS, build_system_prompt
from common import (
    MLX_LM_FOLDER,
    ChatResult,
    Server,
    default_gguf,
    ensure_mlx_lm_folder,
    first_model,
    free_port,
    llama_cpp_python,
    llama_cpp_server,
    load_average,
    machine_note,
    mlx_lm_server,
    omlx_server,
    stream_chat,
    table,
    versions,
)
from summary import fmt_spread, fmt_x, interleaved, out_path, ratio, summarize, write_json

CONTEXT_LIMIT = 8192  # SmolLM2-135M's max_position_embeddings
PEERS = ("omlx", "mlx_lm.server", "llama.cpp")
NEW_QUESTION = "Which of the files above is the longest? Answer with its path only."
WARMUP = [{"role": "user", "content": "Hi"}]


def phase_names(turns: int) -> list[str]:
    return [
        "cold first turn",
        *(f"follow-up turn {i}" for i in range(1, turns)),
        "same context, new question",
        "replay, same process",
        "first request after a restart",
    ]


def make_server(peer: str, trial_dir: Path, log_name: str, ctx: dict[str, Any]) -> Server:
    args = ctx["args"]
    log = trial_dir / f"{log_name}.log"
    if peer == "omlx":
        return omlx_server(free_port(), trial_dir / "cache", log, args.omlx_arg)
    if peer == "mlx_lm.server":
        return mlx_lm_server(free_port(), ctx["folder"], log, args.mlx_lm_arg)
    return llama_cpp_server(free_port(), ctx["gguf"], log, trial_dir / "llama", args.llama_cpp_arg)


def served_model(peer: str, server: Server, ctx: dict[str, Any]) -> str:
    if peer == "mlx_lm.server":
        return str(ctx["folder"])  # its /v1/models lists the Hugging Face cache instead
    return first_model(server.base_url)


def show(peer: str, label: str, r: ChatResult) -> None:
    print(
        f"  {peer} {label}: TTFT {r.ttft:.3f} s, total {r.total:.3f} s, prompt {r.prompt_tokens}, "
        f"cached {r.cached_tokens}, reply {r.text[:60]!r}",
        flush=True,
    )


def trial(peer: str, round_: int, ctx: dict[str, Any]) -> dict[str, Any]:
    """One peer's whole conversation, replay and restart on a fresh cache; every TTFT."""
    args, system = ctx["args"], ctx["system"]
    trial_dir = ctx["workdir"] / f"round{round_}-{peer}"
    names = phase_names(args.turns)
    phases: dict[str, ChatResult] = {}
    out: dict[str, Any] = {"round": round_, "peer": peer, "load_average": load_average()}
    servers: list[Server] = []
    try:
        first = make_server(peer, trial_dir, "start-1", ctx)
        servers.append(first)
        model, out["first_startup_s"] = timed_start(
            peer, first, ctx, f"{peer} (round {round_ + 1}), first start"
        )
        first.wait_idle()  # the turns below time requests, not the end of start-up work
        messages = [{"role": "system", "content": system}]
        last_prompt: list[dict[str, str]] = []
        for i, user in enumerate(ctx["user_turns"]):
            messages.append({"role": "user", "content": user})
            last_prompt = [dict(m) for m in messages]
            r = stream_chat(first.base_url, model, messages, args.max_tokens)
            phases[names[i]] = r
            show(peer, names[i], r)
            messages.append({"role": "assistant", "content": r.text})
        new_q = [{"role": "system", "content": system}, {"role": "user", "content": NEW_QUESTION}]
        for name, prompt in ((names[-3], new_q), (names[-2], last_prompt)):
            phases[name] = stream_chat(first.base_url, model, prompt, args.max_tokens)
            show(peer, name, phases[name])
        if peer == "omlx":
            # Its first start on a new cache folder dequantized the GGUF; the float32 copy
            # it keeps for later starts is written once the server is quiet (seconds).
            out["prepared_copy_s"] = wait_for_prepared_copy(trial_dir / "cache")
        first.stop()
        second = make_server(peer, trial_dir, "start-2", ctx)
        servers.append(second)
        second.start()
        out["restart_ready_s"] = second.ready_s
        phases[names[-1]] = stream_chat(second.base_url, model, last_prompt, args.max_tokens)
        show(peer, names[-1], phases[names[-1]])
        second.stop()
        # Start-up as a user meets it every day: a start on a cache folder that has been
        # used (omlx: with its prepared copy; mlx_lm.server reads the folder converted once).
        third = make_server(peer, trial_dir, "start-3", ctx)
        servers.append(third)
        _, out["startup_s"] = timed_start(
            peer, third, ctx, f"{peer} (round {round_ + 1}), later start"
        )
        out["port_open_s"], out["ready_s"] = third.started_s, third.ready_s
        third.stop()
    finally:
        for server in servers:
            server.kill()
    out["phases"] = {name: asdict(r) for name, r in phases.items()}
    return out


def timed_start(peer: str, server: Server, ctx: dict[str, Any], label: str) -> tuple[str, float]:
    """Spawn ``server`` and send one short request as soon as it says it is up: the model
    name and spawn -> that request's first token.

    Each peer says "up" differently (omlx: /health ready; mlx_lm.server answers /health
    before its thread has loaded the model; llama.cpp loads before it listens), so only
    the first token compares them.
    """
    server.start(idle=False)
    model = served_model(peer, server, ctx)
    sent = time.time()
    warm = stream_chat(server.base_url, model, WARMUP, 1)
    startup = sent - server.spawned_at + warm.ttft
    print(
        f"{label}: port open {server.started_s:.2f} s, ready {server.ready_s:.2f} s, "
        f"first token {startup:.2f} s",
        flush=True,
    )
    return model, startup


def wait_for_prepared_copy(cache_dir: Path, timeout: float = 120.0) -> float | None:
    """Seconds until omlx's prepared float32 copy is in ``cache_dir`` (None: not in time)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if list_copies(cache_dir / PREPARED_DIR):
            return time.perf_counter() - started
        time.sleep(0.2)
    print(f"note: no prepared copy in {cache_dir} after {timeout:.0f} s", flush=True)
    return None


def summarize_trials(trials: list[dict[str, Any]], peers: list[str], turns: int) -> dict[str, Any]:
    """Per phase and per peer: summaries of TTFT; start-up; ratios omlx / peer."""
    rows: dict[str, dict[str, Any]] = {}
    for name in phase_names(turns):
        rows[name] = {
            p: summarize(
                t["phases"][name]["ttft"] for t in trials if t["peer"] == p and name in t["phases"]
            )
            for p in peers
        }
    for key, label in (
        ("startup_s", "server start-up (spawn -> first token)"),
        ("first_startup_s", "first start on a new cache folder"),
        ("port_open_s", "start-up: port open"),
    ):
        rows[label] = {p: summarize(t.get(key) for t in trials if t["peer"] == p) for p in peers}
    ratios = {
        row: {p: ratio(by_peer.get("omlx"), by_peer[p]) for p in peers if p != "omlx"}
        for row, by_peer in rows.items()
    }
    return {"rows": rows, "ratios": ratios}


def verdicts(summary: dict[str, Any], turns: int) -> list[str]:
    """The issue-14 targets, read from the medians."""
    rows, ratios, out = summary["rows"], summary["ratios"], []

    def check(text: str, value: float | None, limit: float) -> None:
        if value is not None:
            out.append(
                f"{text}: {value:.2f} (target <= {limit}) {'MET' if value <= limit else 'MISSED'}"
            )

    follow = [f"follow-up turn {i}" for i in range(1, turns)]
    for peer, limit in (("mlx_lm.server", 0.8), ("llama.cpp", 1.0)):
        worst = [ratios[f].get(peer) for f in follow if ratios[f].get(peer) is not None]
        check(f"follow-up turns, worst omlx/{peer}", max(worst) if worst else None, limit)
    restart = rows["first request after a restart"].get("omlx")
    check("first request after a restart, omlx seconds", restart and restart["median"], 0.25)
    hit = rows["replay, same process"].get("mlx_lm.server")
    check("first request after a restart / mlx_lm.server's in-RAM replay", ratio(restart, hit), 0.7)
    check("cold turn, omlx/mlx_lm.server", ratios["cold first turn"].get("mlx_lm.server"), 0.75)
    startup = ratios["server start-up (spawn -> first token)"].get("mlx_lm.server")
    check("start-up, omlx/mlx_lm.server", startup, 1.0)
    return out


def report(result: dict[str, Any]) -> None:
    peers, summary = result["peers"], result["summary"]
    headers = ["what", *(f"{p} TTFT" for p in peers), *(f"omlx/{p}" for p in peers if p != "omlx")]
    rows = [
        [
            row,
            *(fmt_spread(by_peer[p]) for p in peers),
            *(fmt_x(summary["ratios"][row][p]) for p in peers if p != "omlx"),
        ]
        for row, by_peer in summary["rows"].items()
    ]
    print(
        f"\nAgent loop, medians of {result['args']['repeats']} interleaved trials (min-max); lower is better"
    )
    print(table(headers, rows))
    first = {t["peer"]: t for t in result["trials"] if t["round"] == 0}
    tok_rows = []
    for name in phase_names(result["args"]["turns"]):
        cells = []
        for p in peers:
            r = first.get(p, {}).get("phases", {}).get(name)
            cells.append(
                "-"
                if r is None
                else f"{r['prompt_tokens'] or '?'} / {r['cached_tokens'] if r['cached_tokens'] is not None else '?'}"
            )
        tok_rows.append([name, *cells])
    print("\nPrompt / cached tokens as each server reported them (round 1; ? = not reported)")
    print(table(["what", *peers], tok_rows))
    for note in result["skipped"].values():
        print(f"note: {note}")
    print("\n" + "\n".join(result["verdicts"]))


def plot(result: dict[str, Any]) -> None:
    rows = result["summary"]["rows"]
    keep = [r for r in rows if r != "start-up: port open"]
    label = {
        r: r.replace("first request after a restart", "after restart")
        .replace("server start-up (spawn -> first token)", "start-up,\nto first token")
        .replace(", ", ",\n")
        for r in keep
    }
    plots.grouped_bars(
        out_path("agent_loop", ".png"),
        f"Agent loop, ~{result['args']['context_tokens']}-token context: TTFT per turn "
        f"(median of {result['args']['repeats']}, whiskers min-max)",
        "seconds (log scale)",
        [label[r] for r in keep],
        {p: [rows[r][p] for r in keep] for p in result["peers"]},
        log=True,
        note=f"omlx {result['versions']['omlx']}; {result['machine']}",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = ensure_mlx_lm_folder(Path(args.mlx_lm_model))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    system, used_files = build_system_prompt(tokenizer, args.context_tokens)
    user_turns = [USER_TURNS[i % len(USER_TURNS)] for i in range(args.turns)]
    worst = len(tokenizer.encode(system).ids) + sum(
        len(tokenizer.encode(u).ids) + 12 + args.max_tokens for u in user_turns
    )
    if worst + 20 > CONTEXT_LIMIT - 64:
        raise SystemExit(f"about {worst} tokens by the last turn: over the model's {CONTEXT_LIMIT}")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(peers) - set(PEERS)
    if unknown or "omlx" not in peers:
        raise SystemExit(f"--peers takes omlx plus any of {PEERS[1:]}, not {sorted(unknown)}")
    skipped = {}
    if "llama.cpp" in peers and llama_cpp_python() is None:
        peers.remove("llama.cpp")
        skipped["llama.cpp"] = (
            "llama.cpp skipped: not built (scripts/install-llama-cpp.sh; see its output)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="omlx-agent-bench-"))
    ctx = {
        "args": args,
        "folder": folder,
        "gguf": default_gguf(),
        "system": system,
        "user_turns": user_turns,
        "workdir": workdir,
    }
    result: dict[str, Any] = {
        "machine": machine_note(),
        "versions": versions(),
        "args": vars(args),
        "peers": peers,
        "skipped": skipped,
        "context": {
            "files": used_files,
            "system_tokens": len(tokenizer.encode(system).ids),
            "sha256": hashlib.sha256(system.encode()).hexdigest()[:16],
        },
        "load_average_start": load_average(),
    }
    print(f"machine: {result['machine']}; load average {result['load_average_start']}")
    print(f"versions: {result['versions']}")
    print(
        f"context: {result['context']['system_tokens']} tokens of system prompt; logs in {workdir}",
        flush=True,
    )
    for note in skipped.values():
        print(f"note: {note}")
    trials = []
    try:
        for round_, peer in interleaved(peers, args.repeats):
            trials.append(trial(peer, round_, ctx))
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    omlx_text = {
        (t["round"], n): r["text"]
        for t in trials
        if t["peer"] == "omlx"
        for n, r in t["phases"].items()
    }
    for t in trials:
        t["same_reply_as_omlx"] = {
            n: r["text"] == omlx_text.get((t["round"], n)) for n, r in t["phases"].items()
        }
    result["trials"] = trials
    result["summary"] = summarize_trials(trials, peers, args.turns)
    result["verdicts"] = verdicts(result["summary"], args.turns)
    result["load_average_end"] = load_average()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="trials per peer, interleaved")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument(
        "--context-tokens", type=int, default=2000, help="tokens of the shared system prompt"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated; omlx always")
    parser.add_argument(
        "--json", type=Path, default=None, help="default: bench/out/agent_loop.json"
    )
    parser.add_argument(
        "--mlx-lm-model", default=str(MLX_LM_FOLDER), help="mlx-lm folder of the default GGUF"
    )
    parser.add_argument("--omlx-arg", action="append", default=[], help="extra omlx serve argument")
    parser.add_argument(
        "--mlx-lm-arg", action="append", default=[], help="extra mlx_lm.server argument"
    )
    parser.add_argument(
        "--llama-cpp-arg", action="append", default=[], help="extra llama_cpp.server argument"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (caches, logs)")
    args = parser.parse_args()
    if args.turns < 2 or args.repeats < 1:
        parser.error("--turns must be at least 2 (a follow-up), --repeats at least 1")
    t0 = time.perf_counter()
    result = run(args)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    report(result)
    write_json("agent_loop", result, args.json)
    plot(result)
    print(
        f"wall time {result['wall_s']:.0f} s; load average at the end {result['load_average_end']}"
    )


if __name__ == "__main__":
    main()
