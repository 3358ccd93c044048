"""Two omlx servers behind a proxy: agent sessions with and without affinity (docs/multi-machine.md).

    .venv/bin/python bench/affinity.py [--proxy haproxy|nginx] [--sessions 6] [--turns 4]
                                       [--context-tokens 1500] [--max-tokens 24] [--json OUT]

Starts a throw-away PostgreSQL server (tests/postgres.py), two ``omlx serve`` processes
(default SmolLM2 model) on one cache folder and that index, and the proxy from the
configuration shipped in docs/proxy/ (tests/proxies.py: the same file, ports substituted).
Replays ``--sessions`` agent sessions, interleaved: each round sends every session's next
turn (the conversation so far, the reply, a new user message), starting one session later
than the round before. Twice, each on a fresh cold tier (a new database and folder, the
servers started again): with an ``X-Session-ID`` per session (affinity), and without
(the proxy's round robin). Before each round it waits until both writers have put the
last round's blocks in the shared tier (an agent runs its tools between turns) and
records how long that took.

Per follow-up turn: the server that answered (the proxy's ``x-omlx-upstream``), the tier
``x-omlx-cache`` names, the tokens restored and the TTFT. Its share is what it restored
over what it shares with the turn before, which is what the affinity run restored of the
same turn from RAM (the same conversation: the greedy replies are compared). All sessions
share the agent system prompt of bench/agent_loop.py, as one agent's sessions do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent_prompt import USER_TURNS, build_system_prompt
from common import (
    Server,
    ensure_mlx_lm_folder,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
)
from summary import write_json
from tokenizers import Tokenizer

from tests.postgres import PostgresServer, find_bindir
from tests.proxies import Proxy, binary
from tests.server_process import wait_for_writes

MODEL = "smollm2-135m-instruct"
SHARE_TARGET = 0.99


def replay_order(sessions: int, turns: int) -> list[tuple[int, int]]:
    """(session, turn): round ``t`` sends every session's turn ``t``, from session ``t`` on."""
    return [((t + i) % sessions, t) for t in range(turns) for i in range(sessions)]


def replay(
    proxy: Proxy, servers: list[Server], system: str, args: argparse.Namespace, with_key: bool
) -> tuple[dict[tuple[int, int], dict[str, Any]], list[float]]:
    conversations = {s: [{"role": "system", "content": system}] for s in range(args.sessions)}
    turns: dict[tuple[int, int], dict[str, Any]] = {}
    waits = []
    for s, t in replay_order(args.sessions, args.turns):
        if s == t % args.sessions:  # a round begins
            waits.append(wait_for_writes([s.base_url for s in servers], timeout=300))
        user = f"[task {s}] " + USER_TURNS[(s + t) % len(USER_TURNS)]
        messages = [*conversations[s], {"role": "user", "content": user}]
        headers = {"X-Session-ID": f"session-{s}"} if with_key else None
        r = stream_chat(proxy.base_url, MODEL, messages, args.max_tokens, headers=headers)
        report = dict(part.split("=", 1) for part in r.headers["x-omlx-cache"].split("; "))
        turns[s, t] = {
            "session": s,
            "turn": t,
            "upstream": r.headers.get("x-omlx-upstream", "?"),
            "tier": report["tier"],
            "cached": r.cached_tokens,
            "prompt": r.prompt_tokens,
            "ttft": r.ttft,
            "text": r.text,
        }
        conversations[s] = [*messages, {"role": "assistant", "content": r.text}]
        print(
            f"  {'keyed' if with_key else 'plain'} session {s} turn {t}: {turns[s, t]['upstream']}, "
            f"tier={report['tier']}, cached {r.cached_tokens}/{r.prompt_tokens}, TTFT {r.ttft:.3f} s",
            flush=True,
        )
    return turns, waits


def run_mode(
    pg: PostgresServer, work: Path, system: str, args: argparse.Namespace, with_key: bool
) -> tuple[dict[tuple[int, int], dict[str, Any]], list[float]]:
    """One replay on a fresh cold tier: a new database, a new folder, both servers started."""
    name = "keyed" if with_key else "plain"
    url = pg.create_database()
    servers = [
        omlx_server(
            free_port(),
            work / name / "shared-cache",
            work / name / f"{server_id}.log",
            ["--index-url", url, "--server-id", server_id],
        )
        for server_id in ("a", "b")
    ]
    try:
        for server in servers:
            server.start()
        with Proxy(args.proxy, [s.port for s in servers], work / name / "proxy.log") as proxy:
            return replay(proxy, servers, system, args, with_key)
    finally:
        for server in servers:
            server.stop()
        pg.drop_database(url)


def summarize(keyed: dict, plain: dict) -> dict[str, Any]:
    follow = sorted(k for k in keyed if k[1] > 0)
    rows, shares, same_text = [], [], True
    for k in follow:
        a, p = keyed[k], plain[k]
        before_a, before_p = keyed[k[0], k[1] - 1], plain[k[0], k[1] - 1]
        same_text &= a["text"] == p["text"]
        share = p["cached"] / a["cached"] if a["cached"] else None
        shares.append(share)
        rows.append(
            {
                "session": k[0],
                "turn": k[1],
                "prompt": a["prompt"],
                "keyed_same_server": a["upstream"] == before_a["upstream"],
                "keyed_tier": a["tier"],
                "keyed_cached": a["cached"],
                "keyed_ttft": a["ttft"],
                "plain_other_server": p["upstream"] != before_p["upstream"],
                "plain_tier": p["tier"],
                "plain_cached": p["cached"],
                "plain_ttft": p["ttft"],
                "share": share,
            }
        )
    crossed = [r for r in rows if r["plain_other_server"]]
    stayed = [r for r in rows if not r["plain_other_server"]]
    all_hot = all(r["keyed_tier"] == "hot" and r["keyed_same_server"] for r in rows)
    worst = min((s for s in shares if s is not None), default=None)
    crossed_ssd = all(r["plain_tier"] == "ssd" for r in crossed)
    verdicts = [
        f"with affinity: {sum(r['keyed_tier'] == 'hot' for r in rows)}/{len(rows)} follow-ups "
        f"tier=hot on their previous server (target: all) {'MET' if all_hot else 'MISSED'}",
        f"without affinity: worst share restored {worst:.4f} (target >= {SHARE_TARGET}); "
        f"{len(crossed)}/{len(rows)} on the other server, "
        f"{'all' if crossed_ssd else 'not all'} tier=ssd "
        f"{'MET' if worst is not None and worst >= SHARE_TARGET and crossed_ssd else 'MISSED'}",
    ]
    if not same_text:
        verdicts.append(
            "the replies differed between the two runs: the shares compare unlike prompts"
        )

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {
        "follow_ups": rows,
        "median_ttft": {
            "keyed (hot)": median([r["keyed_ttft"] for r in rows]),
            "plain, other server (ssd)": median([r["plain_ttft"] for r in crossed]),
            "plain, same server (hot)": median([r["plain_ttft"] for r in stayed]),
        },
        "same_text": same_text,
        "verdicts": verdicts,
    }


def report(result: dict[str, Any]) -> None:
    rows = result["summary"]["follow_ups"]
    print(
        table(
            [
                "session/turn",
                "prompt",
                "keyed: tier, cached, TTFT",
                "plain: server, tier, cached, TTFT",
                "share",
            ],
            [
                [
                    f"{r['session']}/{r['turn']}",
                    r["prompt"],
                    f"{r['keyed_tier']}, {r['keyed_cached']}, {r['keyed_ttft']:.3f} s",
                    f"{'other' if r['plain_other_server'] else 'same'}, {r['plain_tier']}, "
                    f"{r['plain_cached']}, {r['plain_ttft']:.3f} s",
                    "-" if r["share"] is None else f"{r['share']:.4f}",
                ]
                for r in rows
            ],
        )
    )
    medians = result["summary"]["median_ttft"]
    print(
        table(
            ["follow-ups", "median TTFT"],
            [[k, "-" if v is None else f"{v:.3f} s"] for k, v in medians.items()],
        )
    )
    for mode, waits in result["writer_waits"].items():
        print(f"{mode}: writers drained {', '.join(f'{w:.2f}' for w in waits)} s before each round")
    print("\n".join(result["summary"]["verdicts"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", choices=("haproxy", "nginx"), default="haproxy")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--context-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if binary(args.proxy) is None:
        raise SystemExit(f"{args.proxy} is not installed (scripts/setup.sh installs it)")
    bindir, why = find_bindir()
    if bindir is None:
        raise SystemExit(why)
    tokenizer = Tokenizer.from_file(str(ensure_mlx_lm_folder() / "tokenizer.json"))
    system, _ = build_system_prompt(tokenizer, args.context_tokens)
    work = Path(tempfile.mkdtemp(prefix="omlx-affinity-bench-", dir="/tmp"))
    print(f"{machine_note()}; load {load_average()}; {args.proxy}; work folder {work}", flush=True)
    with PostgresServer(bindir) as pg:
        keyed, keyed_waits = run_mode(pg, work, system, args, with_key=True)
        plain, plain_waits = run_mode(pg, work, system, args, with_key=False)
    result = {
        "args": vars(args) | {"json": str(args.json) if args.json else None},
        "machine": machine_note(),
        "load_end": load_average(),
        "summary": summarize(keyed, plain),
        "writer_waits": {"keyed": keyed_waits, "plain": plain_waits},
        "first_turns": {
            mode: [turns[s, 0] for s in range(args.sessions)]
            for mode, turns in (("keyed", keyed), ("plain", plain))
        },
    }
    result["verdicts"] = result["summary"]["verdicts"]
    report(result)
    write_json("affinity", result, args.json)


if __name__ == "__main__":
    main()
