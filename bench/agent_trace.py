"""The interleaved agent trace at agent scale against omlx, mlx_lm.server and llama.cpp.

    .venv/bin/python bench/agent_trace.py [--models long,8b-geometry] [--scale 8b-geometry=0.18]
                                          [--peers omlx,mlx_lm.server,llama.cpp] [--repeats 1]
                                          [--no-floor] [--json OUT]

The trace (``trace_shape.build_trace``): a main session shaped like Claude Code's requests
growing turn by turn, a short side call, a three-turn sub-agent, a burst of side calls, a
second session shaped like Codex's alternating with the main one, a restart of the server,
a compaction and follow-ups after it. The same requests go to every peer, one peer at a
time, on a fresh cache; the assistant turns are the trace's own, so every peer sees the
same bytes. The models are ``bench_models``' (random weights, real KV geometry) and the
default SmolLM2-135M (``default``).

Per request: TTFT (client side), prompt and cached tokens as the server reports them, the
tokens this main turn shares with the previous one (counted here with the same
tokenizer), and for omlx the blocks read from each tier (``/metrics``) with their bytes.
For omlx's main turns a *floor probe* follows: the same prompt with its first new message
changed, so the same new tokens are prefilled over a context already restored to RAM (the
compute floor the targets compare against). Over the run: each server's RSS, omlx's
hot-tier bytes and every peer's cache folder on disk. After the run, the disk's ``cat``
rate over omlx's block files. Writes ``bench/out/agent_trace.json`` and two PNGs per model.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_models
from common import (
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
    versions,
)
from summary import interleaved, write_json
from trace_report import plot, report, verdicts
from trace_shape import Step, build_trace, chatml

PEERS = ("omlx", "mlx_lm.server", "llama.cpp")
BLOCK = 64  # omlx's default block size (tokens)
# Of the recorded sizes (a 24k-token first prompt): what this 2-core machine prefills in time.
DEFAULT_SCALE = {"long": 0.6, "8b-geometry": 0.1, "default": 0.2}


def model_target(kind: str, layers: int | None) -> dict[str, Any]:
    """Folder, GGUF, KV bytes per token and context of one bench model (built on first use)."""
    tokenizer_folder = ensure_mlx_lm_folder()
    if kind == "default":
        config = __import__("json").loads((tokenizer_folder / "config.json").read_text())
        kv = (
            2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 4
        )
        return {
            "kind": kind,
            "folder": tokenizer_folder,
            "gguf": default_gguf(),
            "omlx_model": None,
            "kv_bytes_per_token": kv,
            "context": config["max_position_embeddings"],
            "geometry": {
                k: config[k] for k in ("num_hidden_layers", "num_key_value_heads", "head_dim")
            },
        }
    g = bench_models.geometry(kind, layers)
    folder = bench_models.build(g, tokenizer_folder, default_gguf())
    return {
        "kind": kind,
        "folder": folder,
        "gguf": folder / "model.gguf",
        "omlx_model": folder,
        "kv_bytes_per_token": g.kv_bytes_per_token,
        "context": g.context,
        "geometry": {
            "layers": g.layers,
            "kv_heads": g.kv_heads,
            "head_dim": g.head_dim,
            "hidden": g.hidden,
            "dtype": g.dtype,
        },
    }


def make_server(
    peer: str, target: dict[str, Any], run_dir: Path, log: str, n_ctx: int, extra: dict
) -> Server:
    log_path = run_dir / f"{log}.log"
    if peer == "omlx":
        model = ["--model", str(target["omlx_model"])] if target["omlx_model"] else []
        return omlx_server(
            free_port(), run_dir / "cache", log_path, [*model, *extra.get("omlx", [])]
        )
    if peer == "mlx_lm.server":
        return mlx_lm_server(free_port(), target["folder"], log_path, extra.get("mlx_lm", []))
    return llama_cpp_server(
        free_port(),
        target["gguf"],
        log_path,
        run_dir / "llama",
        ["--n_ctx", str(n_ctx), *extra.get("llama_cpp", [])],
    )


def served_model(peer: str, server: Server, target: dict[str, Any]) -> str:
    return str(target["folder"]) if peer == "mlx_lm.server" else first_model(server.base_url)


def omlx_counters(base_url: str) -> dict[str, float]:
    """omlx's cache counters summed over models: blocks read per tier, hot bytes, blocks written."""
    wanted = {
        'omlx_cache_block_hits_total{tier="hot"': "hot_blocks",  # counters get _total
        'omlx_cache_block_hits_total{tier="ssd"': "ssd_blocks",
        'omlx_cache_bytes{tier="hot"': "hot_bytes",
        'omlx_cache_max_bytes{tier="hot"': "hot_max_bytes",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for line in httpx.get(base_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("}", 1)[0]
        for prefix, key in wanted.items():
            head, _, labels = prefix.partition("{")
            if name.startswith(head + "{") and labels in name:
                out[key] += float(line.rsplit(None, 1)[1])
    return out


def rss_bytes(server: Server) -> int | None:
    try:
        for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, AttributeError):
        return None
    return None


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def floor_probe(step: Step) -> list[dict[str, str]]:
    """``step``'s prompt with its first new message changed: same new tokens, same context."""
    messages = [dict(m) for m in step.messages]
    i = len(step.shared_with_previous)
    messages[i]["content"] = "~" + messages[i]["content"]
    return messages


def run_trace(
    peer: str, round_: int, target: dict[str, Any], steps: list[Step], ctx: dict
) -> dict[str, Any]:
    """One peer through the whole trace on a fresh cache: a row per step, footprint over the run."""
    run_dir = ctx["workdir"] / f"{target['kind']}-round{round_}-{peer}"
    n_ctx = ctx["n_ctx"]
    servers: list[Server] = []
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"peer": peer, "round": round_, "load_average": load_average()}
    cache_dir = run_dir / ("cache" if peer == "omlx" else "llama")
    try:
        server = make_server(peer, target, run_dir, "start-1", n_ctx, ctx["extra"])
        servers.append(server)
        server.start()
        model = served_model(peer, server, target)
        for step in steps:
            row: dict[str, Any] = {
                "label": step.label,
                "session": step.session,
                "after": step.after,
            }
            if step.restart_before:
                server.stop()
                server = make_server(peer, target, run_dir, "start-2", n_ctx, ctx["extra"])
                servers.append(server)
                server.start()
                row["restart_ready_s"] = server.ready_s
            before = omlx_counters(server.base_url) if peer == "omlx" else None
            r = stream_chat(server.base_url, model, step.messages, step.max_tokens, timeout=1800)
            row |= result_row(r, step, ctx["count"])
            if before is not None:
                after = omlx_counters(server.base_url)
                block_bytes = BLOCK * target["kv_bytes_per_token"]
                for tier in ("hot", "ssd"):
                    n = after[f"{tier}_blocks"] - before[f"{tier}_blocks"]
                    row[f"{tier}_blocks_read"] = int(n)
                    row[f"{tier}_bytes_read"] = int(n * block_bytes)
                row["hot_tier_bytes"] = int(after["hot_bytes"])
                row["hot_tier_max_bytes"] = int(after["hot_max_bytes"])
                if ctx["floor"] and step.session == "main" and step.shared_with_previous:
                    probe = stream_chat(
                        server.base_url, model, floor_probe(step), step.max_tokens, timeout=1800
                    )
                    row["floor_ttft"] = probe.ttft
                    row["floor_cached"] = probe.cached_tokens
            row["rss_bytes"] = rss_bytes(server)
            row["disk_bytes"] = disk_bytes(cache_dir)
            rows.append(row)
            print(
                f"  {peer} {step.label}: TTFT {r.ttft:.2f} s, prompt {r.prompt_tokens}, cached "
                f"{r.cached_tokens}, shared {row['shared_tokens']}"
                + (f", floor {row['floor_ttft']:.2f} s" if "floor_ttft" in row else "")
                + (
                    f", read hot {row['hot_blocks_read']} ssd {row['ssd_blocks_read']} blocks"
                    if "hot_blocks_read" in row
                    else ""
                ),
                flush=True,
            )
        server.stop()
    finally:
        for s in servers:
            s.kill()
    out["rows"] = rows
    if peer == "omlx":
        out["cat"] = cat_rate(cache_dir)
    return out


def result_row(r: ChatResult, step: Step, count) -> dict[str, Any]:
    shared = count(chatml(step.shared_with_previous, False)) if step.shared_with_previous else 0
    row = {
        "ttft": r.ttft,
        "total": r.total,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "shared_tokens": shared,
    }
    if shared and r.cached_tokens is not None:
        row["reused_share"] = min(r.cached_tokens, shared) / shared
    return row


def cat_rate(cache_dir: Path) -> dict[str, Any]:
    """``cat`` of every block file to /dev/null: bytes, seconds, bytes/s (page cache as it is)."""
    files = [str(p) for p in cache_dir.rglob("*.safetensors") if "prepared" not in p.parts]
    if not files:
        return {}
    size = sum(Path(f).stat().st_size for f in files)
    t0 = time.perf_counter()
    for i in range(0, len(files), 500):
        subprocess.run(["cat", *files[i : i + 500]], stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - t0
    return {"files": len(files), "bytes": size, "seconds": seconds, "bytes_per_s": size / seconds}


def distinct_tokens(prompts: list[list[dict[str, str]]], count_ids) -> int:
    """Tokens in distinct 64-token blocks over ``prompts`` (what a cache holds once)."""
    seen: set[str] = set()
    total = 0
    for messages in prompts:
        ids = count_ids(chatml(messages))
        key = ""
        for i in range(0, len(ids), BLOCK):
            key = hashlib.sha256(
                (key + repr(ids[i : i + BLOCK])).encode()
            ).hexdigest()  # a chain, as omlx keys
            if key not in seen:
                seen.add(key)
                total += len(ids[i : i + BLOCK])
    return total


def run_model(
    kind: str,
    args: argparse.Namespace,
    peers: list[str],
    workdir: Path,
    checkpoint=lambda model: None,
) -> dict[str, Any]:
    target = model_target(kind, args.layers if kind == "8b-geometry" else None)
    tokenizer = Tokenizer.from_file(str(target["folder"] / "tokenizer.json"))

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    def count(text: str) -> int:
        return len(ids(text))

    scale = args.scales.get(kind, DEFAULT_SCALE[kind])
    steps = build_trace(
        count, scale=scale, main_turns=args.main_turns, text_commit=args.text_commit
    )
    longest = max(count(chatml(s.messages)) for s in steps)
    n_ctx = min(target["context"], -(-(longest + 256) // 1024) * 1024)
    if longest + 64 > target["context"]:
        raise SystemExit(
            f"{kind}: the trace reaches {longest} tokens, over the model's {target['context']}"
        )
    print(
        f"\n## {kind}: {target['geometry']}, {target['kv_bytes_per_token']} B of KV per token; "
        f"scale {scale}: {len(steps)} requests, main session {count(chatml(steps[0].messages))} -> "
        f"{longest} tokens",
        flush=True,
    )
    ctx = {
        "workdir": workdir,
        "count": count,
        "n_ctx": n_ctx,
        "floor": not args.no_floor,
        "extra": {
            "omlx": args.omlx_arg,
            "mlx_lm": args.mlx_lm_arg,
            "llama_cpp": args.llama_cpp_arg,
        },
    }
    runs: list[dict[str, Any]] = []
    model = {"model": kind, "geometry": target["geometry"], "scale": scale, "runs": runs}
    for round_, peer in interleaved(peers, args.repeats):
        runs.append(run_trace(peer, round_, target, steps, ctx))
        checkpoint(model)  # an interrupted run keeps the peers it finished
    prompts = [s.messages for s in steps]
    if ctx["floor"]:  # the probes' tails are cached too
        prompts += [floor_probe(s) for s in steps if s.session == "main" and s.shared_with_previous]
    weights = sum(p.stat().st_size for p in Path(target["folder"]).glob("*.safetensors"))
    return {
        "model": kind,
        "geometry": target["geometry"],
        "kv_bytes_per_token": target["kv_bytes_per_token"],
        "weights_bytes": weights,
        "scale": scale,
        "n_ctx": n_ctx,
        "steps": [
            {
                "label": s.label,
                "session": s.session,
                "after": s.after,
                "prompt_tokens": count(chatml(s.messages)),
                "restart_before": s.restart_before,
            }
            for s in steps
        ],
        "distinct_tokens": distinct_tokens(prompts, ids),
        "runs": runs,
    }


def parse_scales(values: list[str]) -> dict[str, float]:
    out = {}
    for v in values:
        kind, _, number = v.partition("=")
        if kind not in DEFAULT_SCALE or not number:
            raise SystemExit(
                f"--scale takes MODEL=FACTOR with MODEL one of {sorted(DEFAULT_SCALE)}, not {v!r}"
            )
        out[kind] = float(number)
    return out


def replot(paths: list[Path], out: Path | None) -> None:
    """Report and plot saved results; several files (e.g. one peer run later) merge by model."""
    import json

    results = [json.loads(p.read_text()) for p in paths]
    merged = results[0]
    by_name = {m["model"]: m for m in merged["models"]}
    for extra in results[1:]:
        merged["peers"] += [p for p in extra["peers"] if p not in merged["peers"]]
        merged["skipped"] = {k: v for k, v in merged["skipped"].items() if k not in extra["peers"]}
        merged.setdefault("merged_from", []).append(
            {"args": extra["args"], "git_sha": extra.get("git_sha")}
        )
        for m in extra["models"]:
            if m["model"] in by_name:
                by_name[m["model"]]["runs"] += [
                    r
                    for r in m["runs"]
                    if r["peer"] != "omlx"
                    or not any(x["peer"] == "omlx" for x in by_name[m["model"]]["runs"])
                ]
            else:
                merged["models"].append(m)
    merged["verdicts"] = verdicts(merged)
    report(merged)
    write_json("agent_trace", merged, out)
    plot(merged)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="long,8b-geometry", help="comma-separated: long, 8b-geometry, default"
    )
    parser.add_argument(
        "--scale", action="append", default=[], help="MODEL=FACTOR of the recorded sizes"
    )
    parser.add_argument(
        "--layers", type=int, default=None, help="8b-geometry's layers (default 24)"
    )
    parser.add_argument("--main-turns", type=int, default=12)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-floor", action="store_true", help="skip omlx's floor probes")
    parser.add_argument(
        "--text-commit",
        default=None,
        help="take the trace's text from this commit (default: the working tree); "
        "runs to compare need the same",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="default: bench/out/agent_trace.json"
    )
    parser.add_argument("--omlx-arg", action="append", default=[])
    parser.add_argument("--mlx-lm-arg", action="append", default=[])
    parser.add_argument("--llama-cpp-arg", action="append", default=[])
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (caches, logs)")
    parser.add_argument(
        "--replot",
        type=Path,
        nargs="+",
        default=None,
        help="no run: report and plot these JSON results (runs of one model merged)",
    )
    args = parser.parse_args()
    if args.replot:
        replot(args.replot, args.json)
        return
    args.scales = parse_scales(args.scale)
    models = [m for m in args.models.split(",") if m]
    if unknown := set(models) - set(DEFAULT_SCALE):
        parser.error(f"unknown models {sorted(unknown)}")
    peers = [p for p in args.peers.split(",") if p]
    if set(peers) - set(PEERS) or not peers:
        parser.error(f"--peers takes any of {PEERS} (a run without omlx is merged by --replot)")
    skipped = {}
    if "llama.cpp" in peers and llama_cpp_python() is None:
        peers.remove("llama.cpp")
        skipped["llama.cpp"] = "llama.cpp skipped: not built (scripts/install-llama-cpp.sh)"
    result: dict[str, Any] = {
        "machine": machine_note(),
        "versions": versions(),
        "args": {k: v for k, v in vars(args).items() if k != "scales"},
        "peers": peers,
        "skipped": skipped,
        "load_average_start": load_average(),
    }
    print(f"machine: {result['machine']}; load average {result['load_average_start']}")
    for note in skipped.values():
        print(f"note: {note}")
    workdir = Path(tempfile.mkdtemp(prefix="omlx-trace-bench-"))
    t0 = time.perf_counter()
    done: list[dict[str, Any]] = []

    def checkpoint(model: dict[str, Any]) -> None:
        write_json(
            "agent_trace_partial",
            {**result, "models": [*done, model]},
            args.json.with_name(args.json.stem + "_partial.json") if args.json else None,
        )

    try:
        for kind in models:
            done.append(run_model(kind, args, peers, workdir, checkpoint))
        result["models"] = done
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    result["load_average_end"] = load_average()
    result["verdicts"] = verdicts(result)
    report(result)
    write_json("agent_trace", result, args.json)
    plot(result)
    print(
        f"wall time {result['wall_s']:.0f} s; load average at the end {result['load_average_end']}"
    )


if __name__ == "__main__":
    main()
