"""Images: a 6-turn screenshot conversation against omlx and mlx_vlm.server on the same weights.

    .venv/bin/python bench/vision.py [--repeats 3] [--max-tokens 8] [--system-tokens 1800]
                                     [--peers omlx,mlx_vlm.server,mlx_vlm.server+apc] [--json OUT]

The model is ``vision_model.build_bench_vlm``'s (a random-weight gemma3, 256 image tokens
per image). The conversation: a system prompt, a 640x400 PNG screenshot drawn with Pillow
at turn 1 and another at turn 4, each turn a short user message after the previous answer
(greedy, streamed). Per peer and round, in interleaved order: a fresh server runs the six
turns; then it is stopped and started again (omlx on the same cache folder) and turn 6 is
sent again (its restart turn); for omlx, turn 6 is also sent to a server on a fresh cache
folder (its cold turn: the recompute). Once, omlx with ``--no-cache`` runs the six turns:
its greedy text must equal the cached run's (hit == miss).

Per turn: TTFT (client side, to the first content chunk), prompt and cached tokens as the
server reports them, the share of the previous turn's prompt (the prefix this turn shares
with it) the server reports cached, and for omlx the encoder passes (``/health``) the turn
cost. ``mlx_vlm.server`` runs at its defaults (its prefix cache, APC, is off unless
``APC_ENABLED=1``; its vision-feature cache holds 20 images); the peer
``mlx_vlm.server+apc`` (in the default set) is the same server with ``APC_ENABLED=1`` and its disk tier in the
round's folder, so its restart turn may restore from disk too. The targets are read
against the defaults. Writes ``bench/out/vision.json``.
"""

from __future__ import annotations

import argparse
import base64
import io
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    OPENBLAS,
    ChatResult,
    Server,
    first_model,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
    versions,
)
from summary import fmt_spread, interleaved, ratio, summarize, write_json
from vision_model import FOLDER, build_bench_vlm

APC_PEER = "mlx_vlm.server+apc"  # mlx_vlm.server with its prefix cache on (not its default)
PEERS = ("omlx", "mlx_vlm.server", APC_PEER)
IMAGE_TURNS = (1, 4)  # the turns that bring a new screenshot


def screenshot(seed: int) -> bytes:
    """A 640x400 PNG that looks like an editor window: title bar, panes, text, a status bar."""
    accent = [(30, 60, 140), (150, 40, 40)][seed % 2]
    img = Image.new("RGB", (640, 400), (245, 245, 245))
    d = ImageDraw.Draw(img)
    d.rectangle([0, 0, 640, 28], fill=accent)
    d.text((10, 8), f"editor - project{seed}/main.py", fill="white")
    d.rectangle([0, 28, 150, 376], fill=(225, 228, 232))
    for i, name in enumerate(["main.py", "util.py", "tests/", "README.md", "setup.cfg"]):
        d.text((12, 40 + 22 * i), name, fill=(20, 20, 20))
    for i in range(14):
        d.text(
            (165, 40 + 22 * i),
            f"{i + 1:3d}  def step_{seed}_{i}(x): return x * {i + seed}",
            fill=(0, 0, 90),
        )
    if seed % 2:
        d.rectangle([300, 150, 600, 250], fill=(255, 235, 235), outline=(200, 0, 0), width=2)
        d.text((315, 190), "Error: step_1_3 raised ValueError", fill=(160, 0, 0))
    d.rectangle([0, 376, 640, 400], fill=(60, 60, 60))
    d.text(
        (10, 382),
        f"Ln {12 + seed}, Col 4   UTF-8   Python   {'1 error' if seed % 2 else 'ok'}",
        fill="white",
    )
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def image_part(png: bytes) -> dict[str, Any]:
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }


def system_prompt(tokens: int, folder: Path) -> str:
    """Numbered house rules, as many as make ``tokens`` tokens with the model's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = "You review screenshots of a developer's editor and answer in a few words.\n"
    i = 0
    while len(tok.encode(text).ids) < tokens:
        i += 1
        text += f"Rule {i}: describe what changed on screen since screenshot {i % 7}, then stop.\n"
    return text


def user_turns() -> list[list[dict[str, Any]] | str]:
    first, second = screenshot(0), screenshot(1)
    return [
        [image_part(first), {"type": "text", "text": "What is on this screen?"}],
        "Which file is open?",
        "What does the status bar say?",
        [
            {"type": "text", "text": "Here is the screen after I ran the tests."},
            image_part(second),
            {"type": "text", "text": "What changed?"},
        ],
        "Which function failed?",
        "Summarize both screenshots.",
    ]


def encoder_stats(server: Server, model: str) -> dict[str, int] | None:
    """omlx's per-model image counters from /health (None for a peer without them)."""
    try:
        body = httpx.get(server.base_url + "/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None
    images = ((body.get("models") or {}).get(model) or {}).get("images")
    return images if isinstance(images, dict) and "encoder_passes" in images else None


def send(server: Server, model: str, messages: list[dict], args) -> tuple[ChatResult, int | None]:
    """One streamed greedy turn and the encoder passes it cost (omlx only)."""
    before = encoder_stats(server, model)
    r = stream_chat(server.base_url, model, messages, args.max_tokens)
    after = encoder_stats(server, model)
    passes = after["encoder_passes"] - before["encoder_passes"] if before and after else None
    return r, passes


def row(turn: int, r: ChatResult, passes: int | None, previous_prompt: int | None) -> dict:
    share = None
    if previous_prompt and r.cached_tokens is not None:
        share = min(r.cached_tokens, previous_prompt) / previous_prompt
    return {
        "turn": turn,
        "ttft_s": r.ttft,
        "total_s": r.total,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "shared_prefix_tokens": previous_prompt,
        "restored_share": share,
        "encoder_passes": passes,
        "text": r.text,
    }


def converse(server: Server, model: str, system: str, args) -> tuple[list[dict], list[dict]]:
    """The six turns; returns the rows and turn 6's messages (for the restart replay)."""
    messages: list[dict] = [{"role": "system", "content": system}]
    rows: list[dict] = []
    previous = None
    for turn, content in enumerate(user_turns(), 1):
        messages.append({"role": "user", "content": content})
        r, passes = send(server, model, messages, args)
        rows.append(row(turn, r, passes, previous))
        print(
            f"    turn {turn}: TTFT {r.ttft:.3f} s, prompt {r.prompt_tokens}, cached {r.cached_tokens}, "
            f"encoder passes {passes}, text {r.text!r}",
            flush=True,
        )
        previous = r.prompt_tokens
        if turn < len(user_turns()):
            messages.append({"role": "assistant", "content": r.text})
    return rows, messages


def make_server(peer: str, folder: Path, run_dir: Path, log: str, extra=()) -> Server:
    log_path = run_dir / f"{log}.log"
    if peer == "omlx":
        return omlx_server(
            free_port(), run_dir / "cache", log_path, ["--model", str(folder), *extra]
        )
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "mlx_vlm.server",
        "--model",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {"LD_PRELOAD": OPENBLAS} if Path(OPENBLAS).exists() else {}  # as omlx loads it
    if peer == APC_PEER:
        env |= {"APC_ENABLED": "1", "APC_DISK_PATH": str(run_dir / "apc")}
    return Server(peer, argv, port, log_path, env=env)


def served(peer: str, server: Server, folder: Path) -> str:
    return str(folder) if peer.startswith("mlx_vlm") else first_model(server.base_url)


def one_turn(peer: str, folder: Path, run_dir: Path, log: str, messages: list[dict], args) -> dict:
    """A fresh process on ``run_dir``'s cache folder answering ``messages`` once."""
    server = make_server(peer, folder, run_dir, log)
    try:
        server.start()
        model = served(peer, server, folder)
        r, passes = send(server, model, messages, args)
    finally:
        server.stop()
    out = row(6, r, passes, r.prompt_tokens)
    out["restored_share"] = (
        None
        if r.cached_tokens is None or not r.prompt_tokens
        else r.cached_tokens / r.prompt_tokens
    )
    out["ready_s"] = server.ready_s
    return out


def run_peer(peer: str, round_: int, folder: Path, system: str, args, workdir: Path) -> dict:
    run_dir = workdir / f"round{round_}-{peer}"
    out: dict[str, Any] = {"peer": peer, "round": round_, "load_average": load_average()}
    print(f"  round {round_ + 1}, {peer}", flush=True)
    server = make_server(peer, folder, run_dir, "conversation")
    try:
        server.start()
        out["ready_s"] = server.ready_s
        out["turns"], last = converse(server, served(peer, server, folder), system, args)
    finally:
        server.stop()
    out["restart"] = one_turn(peer, folder, run_dir, "restart", last, args)
    r = out["restart"]
    print(
        f"    turn 6 after a restart: TTFT {r['ttft_s']:.3f} s, cached {r['cached_tokens']}, "
        f"encoder passes {r['encoder_passes']}",
        flush=True,
    )
    if peer == "omlx":
        out["cold"] = one_turn(
            peer, folder, workdir / f"round{round_}-omlx-cold", "cold", last, args
        )
        r = out["cold"]
        print(
            f"    turn 6 on a fresh cache folder: TTFT {r['ttft_s']:.3f} s, cached {r['cached_tokens']}",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=1800)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--model", type=Path, default=FOLDER, help="where the bench model is built")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the servers' logs and caches")
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if p]

    folder = build_bench_vlm(args.model)
    system = system_prompt(args.system_tokens, folder)
    result: dict[str, Any] = {
        "machine": machine_note(),
        "load_average_start": load_average(),
        "args": vars(args),
        "model": {"folder": folder, "sizes": (folder / "bench_sizes.json").read_text()},
    }
    print(f"machine: {result['machine']}; load average {result['load_average_start']}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="omlx-vision-bench-", dir="/tmp"))
    runs: list[dict] = []
    try:
        for round_, peer in interleaved(peers, args.repeats):
            runs.append(run_peer(peer, round_, folder, system, args, workdir))
        if "omlx" in peers:
            print("  omlx --no-cache (hit == miss)", flush=True)
            server = make_server("omlx", folder, workdir / "no-cache", "no-cache", ["--no-cache"])
            try:
                server.start()
                result["no_cache_turns"], _ = converse(
                    server, first_model(server.base_url), system, args
                )
            finally:
                server.stop()
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["runs"] = runs
    result["load_average_end"] = load_average()
    report(result, peers, args)


def turn_stats(runs: list[dict], peer: str, turn: int, key: str) -> dict | None:
    return summarize(r["turns"][turn - 1][key] for r in runs if r["peer"] == peer)


def report(result: dict, peers: list[str], args) -> None:
    runs = result["runs"]
    stats: dict[str, Any] = {}
    rows = []
    for peer in peers:
        stats[peer] = {}
        for turn in range(1, 7):
            s = {
                k: turn_stats(runs, peer, turn, k)
                for k in (
                    "ttft_s",
                    "prompt_tokens",
                    "cached_tokens",
                    "restored_share",
                    "encoder_passes",
                )
            }
            stats[peer][turn] = s
            rows.append(
                [
                    peer,
                    turn,
                    fmt_spread(s["ttft_s"]),
                    fmt_spread(s["prompt_tokens"], "", 0),
                    fmt_spread(s["cached_tokens"], "", 0),
                    "-" if s["restored_share"] is None else f"{s['restored_share']['min']:.2%}",
                    fmt_spread(s["encoder_passes"], "", 0),
                ]
            )
        for kind in ("restart", "cold"):
            picked = [r[kind] for r in runs if r["peer"] == peer and kind in r]
            if not picked:
                continue
            s = {
                k: summarize(p[k] for p in picked)
                for k in ("ttft_s", "prompt_tokens", "cached_tokens", "encoder_passes")
            }
            stats[peer][kind] = s
            rows.append(
                [
                    peer,
                    f"6 ({kind})",
                    fmt_spread(s["ttft_s"]),
                    fmt_spread(s["prompt_tokens"], "", 0),
                    fmt_spread(s["cached_tokens"], "", 0),
                    "-",
                    fmt_spread(s["encoder_passes"], "", 0),
                ]
            )
    print(
        f"\nA 6-turn screenshot conversation, median of {args.repeats} interleaved repeats (min-max)"
    )
    print(
        table(
            [
                "server",
                "turn",
                "TTFT",
                "prompt tokens",
                "cached tokens",
                "restored (min)",
                "encoder passes",
            ],
            rows,
        )
    )

    verdicts = []
    if "omlx" in peers and "mlx_vlm.server" in peers:
        follow = {
            t: ratio(stats["omlx"][t]["ttft_s"], stats["mlx_vlm.server"][t]["ttft_s"])
            for t in range(2, 7)
        }
        result["follow_up_ttft_ratio"] = follow
        worst = max(follow.values())
        verdicts.append(
            "follow-up TTFT omlx / mlx_vlm.server, turns 2-6: "
            + ", ".join(f"{v:.2f}" for v in follow.values())
            + f" (target <= 0.8 each) {'MET' if worst <= 0.8 else 'MISSED'}"
        )
    if "omlx" in peers:
        o = stats["omlx"]
        restart = ratio(o["restart"]["ttft_s"], o["cold"]["ttft_s"])
        result["restart_over_recompute"] = restart
        verdicts.append(
            f"omlx turn 6 after a restart / on a fresh cache: {o['restart']['ttft_s']['median']:.3f} s / "
            f"{o['cold']['ttft_s']['median']:.3f} s = {restart:.2f} (target <= 0.25) {'MET' if restart <= 0.25 else 'MISSED'}"
        )
        if "mlx_vlm.server" in peers:
            peer_restart = stats["mlx_vlm.server"]["restart"]["ttft_s"]
            r2 = ratio(o["restart"]["ttft_s"], peer_restart)
            result["restart_over_mlx_vlm_restart"] = r2
            verdicts.append(
                f"omlx turn 6 after a restart / mlx_vlm.server's turn 6 after its restart (its recompute): "
                f"{o['restart']['ttft_s']['median']:.3f} s / {peer_restart['median']:.3f} s = {r2:.2f}"
            )
        shares = [
            r["turns"][t - 1]["restored_share"]
            for r in runs
            if r["peer"] == "omlx"
            for t in range(2, 7)
        ]
        low = min(s for s in shares if s is not None)
        result["restored_share_min"] = low
        verdicts.append(
            f"omlx: least share of a follow-up's shared prefix restored, turns 2-6 over all repeats: {low:.2%} "
            f"(target >= 99%) {'MET' if low >= 0.99 else 'MISSED'}"
        )
        seen = [
            r["turns"][t - 1]["encoder_passes"]
            for r in runs
            if r["peer"] == "omlx"
            for t in (2, 3, 5, 6)
        ]
        seen += [r["restart"]["encoder_passes"] for r in runs if r["peer"] == "omlx"]
        fourth = [r["turns"][3]["encoder_passes"] for r in runs if r["peer"] == "omlx"]
        verdicts.append(
            f"omlx encoder passes on turns showing only images seen before (2, 3, 5, 6, restart): max {max(seen)} "
            f"(target 0) {'MET' if max(seen) == 0 else 'MISSED'}; turn 4 (one new image): {fourth}"
        )
        cached_text = [t["text"] for t in next(r for r in runs if r["peer"] == "omlx")["turns"]]
        miss_text = [t["text"] for t in result.get("no_cache_turns", [])]
        same = cached_text == miss_text
        result["hit_equals_miss"] = same
        verdicts.append(
            f"omlx greedy text with cache == with --no-cache, 6 turns: {'MET' if same else 'MISSED'}"
        )
        if "mlx_vlm.server" in peers:
            peer_text = [
                t["text"] for t in next(r for r in runs if r["peer"] == "mlx_vlm.server")["turns"]
            ]
            verdicts.append(
                f"omlx's greedy text == mlx_vlm.server's (same weights), 6 turns: {cached_text == peer_text}"
            )
    for peer in [p for p in peers if p.startswith("mlx_vlm")]:
        cached = [t["cached_tokens"] for r in runs if r["peer"] == peer for t in r["turns"]]
        verdicts.append(
            f"{peer}'s reported cached_tokens over all turns: max {max(c or 0 for c in cached)}"
        )
    if "omlx" in peers and APC_PEER in peers:
        follow = {
            t: ratio(stats["omlx"][t]["ttft_s"], stats[APC_PEER][t]["ttft_s"]) for t in range(2, 7)
        }
        result["follow_up_ttft_ratio_vs_apc"] = follow
        r2 = ratio(stats["omlx"]["restart"]["ttft_s"], stats[APC_PEER]["restart"]["ttft_s"])
        verdicts.append(
            f"(not a target) vs {APC_PEER}: follow-up TTFT omlx / it, turns 2-6: "
            + ", ".join(f"{v:.2f}" for v in follow.values())
            + f"; restart turn 6: {stats['omlx']['restart']['ttft_s']['median']:.3f} s / "
            f"{stats[APC_PEER]['restart']['ttft_s']['median']:.3f} s = {r2:.2f}"
        )
    print("\n".join(verdicts))
    result.update(versions=versions(), stats=stats, verdicts=verdicts)
    for package in ("mlx-vlm", "transformers"):
        from importlib.metadata import version

        result["versions"][package] = version(package)
    write_json("vision", result, args.json)


if __name__ == "__main__":
    main()
