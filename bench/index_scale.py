"""The SQLite index at 10k, 100k and 1M rows: request-path lookups, and what a server's start does.

    .venv/bin/python bench/index_scale.py [--rows 10000,100000,1000000] [--reps 200]
                                          [--no-orphans] [--json OUT] [--keep]

Per size, a fresh cache folder: ``omlx db upgrade`` makes a real index, then one SQL
statement fills ``blocks`` with chains of 32 rows (a 2,048-token prefix each, keys
SHA-256 like the real ones) of one namespace. The block files are not real: the rows
share 256 small files, so a start-up reconcile finds every row's file (the rows stay).

- Lookups, in this process through ``SqlBlockIndex`` (what a request asks the index):
  ``get_blocks`` of a stored 32-key chain, of 32 unknown keys, ``children`` of a block
  (token-granular matching), ``touch`` of 32 keys (the batched recency write). Each
  ``--reps`` times, random chains, with index.db in the page cache; one first lookup
  right after the page cache was dropped.
- A 64k-token prompt (1,024 blocks; its chain stored among the rows with its tokens, the
  filler chains' first blocks given tokens too), through ``PrefixCache.begin`` as a
  request looks it up: all of it in RAM (an agent's next turn), a new prompt, and what a
  disk hit asks the index before its reads (the keys and 1,024 rows).
- A server's start on that folder: spawn -> /health 200, the start-up reconcile
  (spawn -> its log line; it runs beside serving), a short request's TTFT after it.
- ``orphans`` (unless ``--no-orphans``): the same rows pointing at files that do not
  exist, as after losing the folder's files; the reconcile then deletes every row.

Writes ``bench/out/index_scale.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots
from common import (
    drop_page_cache,
    first_model,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
    versions,
)
from summary import fmt_spread, out_path, summarize, write_json

from omlx.adapters.blockfiles import FileBlockStore
from omlx.adapters.mlx.cache.codec import MLXKVCodec
from omlx.adapters.sqlindex import open_index
from omlx.adapters.sqlindex.repository import encode_head
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo
from omlx.domain.cache.cold_tier import CHILDREN_LIMIT, ColdTier
from omlx.domain.cache.hot_tier import HotTier
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION, chain_keys
from omlx.domain.cache.prefix_cache import PrefixCache

CHAIN = 32  # blocks per stored prefix: 2,048 tokens at 64 per block
LONG_PROMPT = 65_536  # the agent-scale prompt of the 64k lookups: 1,024 blocks
SHARED_FILES = 256
NS_NAME = "bench-index-scale"
NS = hashlib.sha256(NS_NAME.encode()).hexdigest()
RECONCILED = re.compile(r"cache folder reconciled: (.*)")
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")


def key(i: int) -> str:
    return hashlib.sha256(f"{NS}:{i}".encode()).hexdigest()


def db_upgrade(folder: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "omlx", "db", "upgrade", "--cache-dir", str(folder)],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def shared_files(folder: Path) -> list[str]:
    """256 small files in the block layout, which every row's relpath points at."""
    rels = []
    for j in range(SHARED_FILES):
        k = hashlib.sha256(f"file:{j}".encode()).hexdigest()
        rel = f"{NS_NAME}-{NS[:12]}/{k[:2]}/{k}.{k[:12]}.safetensors"
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * 4096)
        rels.append(rel)
    return rels


def fill(folder: Path, rows: int, orphans: bool) -> dict[str, Any]:
    """One INSERT ... SELECT over a recursive CTE: ``rows`` rows in chains of CHAIN.

    A bulk load: the secondary indexes are dropped and rebuilt after (their exact DDL
    from ``sqlite_master``), rows go in key order, no journal; the index is back in WAL
    mode after, as omlx keeps it.
    """
    rels = [] if orphans else shared_files(folder)
    db = sqlite3.connect(folder / "index.db", isolation_level=None)
    db.create_function("k", 1, key, deterministic=True)
    if orphans:
        db.create_function("rel", 1, lambda i: f"{NS_NAME}-{NS[:12]}/gone/{key(i)}.safetensors")
    else:
        db.create_function("rel", 1, lambda i: rels[i % SHARED_FILES], deterministic=True)
    for pragma in (
        "journal_mode=OFF",
        "synchronous=OFF",
        "cache_size=-1048576",
        "temp_store=MEMORY",
    ):
        db.execute(f"PRAGMA {pragma}")
    indexes = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'blocks' AND sql IS NOT NULL"
    ).fetchall()
    now = time.time()
    t0 = time.perf_counter()
    db.execute("BEGIN")
    for name, _ in indexes:
        db.execute(f"DROP INDEX {name}")
    db.execute(
        "INSERT INTO namespaces (digest, model_name, block_size, kv_dtype, layer_count, created_at, last_used_at, format_version) "
        "VALUES (?, ?, 64, 'float32', 30, ?, ?, ?)",
        (NS, NS_NAME, now - 7200, now - 3600, CACHE_FORMAT_VERSION),
    )
    db.execute(
        "INSERT INTO blocks (key, namespace, parent_key, token_count, nbytes, checksum, relpath, created_at, last_access, hit_count, kind) "
        "SELECT * FROM (WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
        "SELECT k(i) AS key, ?, CASE WHEN i % ? = 0 THEN ? ELSE k(i - 1) END, 64, 4096, k(-1 - i), rel(i), "
        "? - 7200 + i * 1e-3, ? - 3600 + (abs(random()) % 3600000) * 1e-3, 0, 'kv' FROM n) ORDER BY key",
        (rows, NS, CHAIN, NS, now, now),
    )
    for _, sql in indexes:
        db.execute(sql)
    db.execute("COMMIT")
    insert_s = time.perf_counter() - t0
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    return {"insert_s": insert_s, "index_mb": (folder / "index.db").stat().st_size / 1e6}


def lookups(folder: Path, rows: int, reps: int) -> dict[str, Any]:
    """Request-path index calls, timed one by one (ms)."""
    rng = random.Random(rows)
    chains = rows // CHAIN
    index = open_index(folder)
    times: dict[str, list[float]] = {
        "get_blocks, 32 stored": [],
        "get_blocks, 32 unknown": [],
        "children": [],
        "touch, 32 keys": [],
    }
    try:
        drop_page_cache()
        c = rng.randrange(chains)
        t0 = time.perf_counter()
        found = index.get_blocks([key(c * CHAIN + j) for j in range(CHAIN)])
        first_ms = 1000 * (time.perf_counter() - t0)
        if len(found) != CHAIN:
            raise SystemExit(f"{len(found)} of {CHAIN} keys found: the generated rows are wrong")
        # A serving index lives in the page cache (715 MB at 1M rows, on a 24 GB machine):
        # read it once, so the timed calls measure SQLite, not the disk's random reads.
        with open(folder / "index.db", "rb") as f:
            while f.read(1 << 24):
                pass
        for _ in range(reps):
            c = rng.randrange(chains)
            chain = [key(c * CHAIN + j) for j in range(CHAIN)]
            unknown = [
                hashlib.sha256(f"x{rng.random()}".encode()).hexdigest() for _ in range(CHAIN)
            ]
            calls = (
                ("get_blocks, 32 stored", lambda chain=chain: index.get_blocks(chain)),
                ("get_blocks, 32 unknown", lambda unknown=unknown: index.get_blocks(unknown)),
                (
                    "children",
                    lambda chain=chain: index.children(
                        chain[rng.randrange(CHAIN - 1)], CHILDREN_LIMIT
                    ),
                ),
                (
                    "touch, 32 keys",
                    lambda chain=chain: index.touch(dict.fromkeys(chain, time.time())),
                ),
            )
            for name, call in calls:
                t0 = time.perf_counter()
                call()
                times[name].append(1000 * (time.perf_counter() - t0))
    finally:
        index.close()
    out = {name: summarize(xs) for name, xs in times.items()}
    for name, xs in times.items():
        out[name]["p99"] = sorted(xs)[int(0.99 * (len(xs) - 1))]
    out["first get_blocks after a page-cache drop"] = summarize([first_ms])
    return out


def log_time(line: str) -> float:
    """The wall-clock time in an ``omlx serve`` log line (``%(asctime)s``, local time)."""
    match = STAMP.search(line)
    if match is None:
        raise ValueError(f"no time in the log line {line!r}")
    return datetime.strptime(match.group(0), "%Y-%m-%d %H:%M:%S,%f").timestamp()


class _NoWriter:
    """The lookups write nothing: the rows are already there."""

    def submit(self, meta, namespace, data) -> bool:
        return False

    def pending(self, key: str) -> bool:
        return False


def long_prompt_lookups(folder: Path, rows: int, reps: int) -> dict[str, Any]:
    """A 64k-token prompt's lookup, as ``PrefixCache.begin`` does it for a request (ms).

    Among the index's ``rows``, one stored chain of 1,024 rows keyed from real token ids
    (as omlx keys them). Timed: (a) the prompt whose blocks are all in RAM (an agent's next
    turn: keys, the RAM walk, the index asked for the last block's children); (b) a new
    prompt (nothing stored: the index asked for its chain's head); (c) what a disk hit
    asks the index before its reads start: the keys and the rows of all 1,024 blocks.
    """
    rng = random.Random(rows + 1)
    tokens = [rng.randrange(49_152) for _ in range(LONG_PROMPT)]
    ns = NamespaceInfo(NS, NS_NAME, "", 64, "float32", 30)
    keys = chain_keys(NS, tokens, 64)
    db = sqlite3.connect(folder / "index.db", isolation_level=None)
    now = time.time()
    with db:
        db.executemany(
            "INSERT INTO blocks (key, namespace, parent_key, token_count, nbytes, checksum, relpath, "
            "created_at, last_access, hit_count, kind) VALUES (?, ?, ?, 64, 4096, ?, ?, ?, ?, 0, 'kv')",
            [
                (
                    k,
                    NS,
                    keys[i - 1] if i else NS,
                    k,
                    f"{NS_NAME}-{NS[:12]}/{k[:2]}/{k}.safetensors",
                    now,
                    now,
                )
                for i, k in enumerate(keys)
            ],
        )
        # Tokens recorded as omlx's writer records them (``block_heads``): for the chain, and
        # for the filler chains' first blocks, the root's other children (random heads).
        db.executemany(
            "INSERT INTO block_heads (key, parent_key, head) VALUES (?, ?, ?)",
            [
                (k, keys[i - 1] if i else NS, encode_head(tokens[i * 64 : (i + 1) * 64]))
                for i, k in enumerate(keys)
            ],
        )
        db.execute(
            "INSERT OR IGNORE INTO block_heads (key, parent_key, head) "
            "SELECT key, parent_key, randomblob(256) FROM blocks WHERE parent_key = ?",
            (NS,),
        )
    db.close()
    index = open_index(folder)
    with open(folder / "index.db", "rb") as f:  # the serving index lives in the page cache
        while f.read(1 << 24):
            pass
    codec = MLXKVCodec()
    hot = HotTier(1 << 40)
    for i, k in enumerate(keys):
        meta = BlockMeta(key=k, parent_key=keys[i - 1] if i else NS, namespace=NS, token_count=64)
        hot.put(meta, tuple(tokens[i * 64 : (i + 1) * 64]), object(), 64 * 4096)
    # The index's lookups are timed here, not block files: no model spec to check them with.
    cold = ColdTier(
        ns,
        FileBlockStore(folder),
        index,
        writer=_NoWriter(),
        decode=codec.decode,
        check=lambda data, meta, **_: None,
    )
    cache = PrefixCache(namespace=ns, codec=codec, hot=hot, cold=cold)
    times: dict[str, list[float]] = {
        "64k prompt, all in RAM": [],
        "64k prompt, new": [],
        "64k prompt, on disk: keys + index rows": [],
    }
    try:
        for _ in range(reps):
            turn = [
                *tokens,
                *(rng.randrange(49_152) for _ in range(40)),
            ]  # the next turn's new text
            t0 = time.perf_counter()
            session = cache.begin(turn)
            times["64k prompt, all in RAM"].append(1000 * (time.perf_counter() - t0))
            if session.cached_tokens != LONG_PROMPT:
                raise SystemExit(
                    f"the RAM lookup found {session.cached_tokens} of {LONG_PROMPT} tokens"
                )
            session.close()
            fresh = [rng.randrange(49_152) for _ in range(LONG_PROMPT)]
            t0 = time.perf_counter()
            session = cache.begin(fresh)
            times["64k prompt, new"].append(1000 * (time.perf_counter() - t0))
            session.close()
            t0 = time.perf_counter()
            found = index.get_blocks(chain_keys(NS, turn, 64))
            times["64k prompt, on disk: keys + index rows"].append(
                1000 * (time.perf_counter() - t0)
            )
            if len(found) != len(keys):
                raise SystemExit(f"{len(found)} of {len(keys)} rows found")
    finally:
        cold.close()
        index.close()
    out = {name: summarize(xs) for name, xs in times.items()}
    for name, xs in times.items():
        out[name]["p99"] = sorted(xs)[int(0.99 * (len(xs) - 1))]
    return out


def server_start(folder: Path, work: Path) -> dict[str, Any]:
    """Start omlx serve on the folder: up, reconcile, one short request; rows left after."""
    server = omlx_server(free_port(), folder, work / f"serve-{folder.name}.log")
    try:
        server.start(idle=False)
        reconciled_s, report = None, None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and reconciled_s is None:
            for line in server.log_tail(50_000).splitlines():
                match = RECONCILED.search(line)
                if match:
                    reconciled_s = log_time(line) - server.spawned_at
                    report = match.group(1)
            if reconciled_s is None:
                time.sleep(0.05)
        server.wait_idle()
        model = first_model(server.base_url)
        ttft = stream_chat(server.base_url, model, [{"role": "user", "content": "Hi"}], 1).ttft
    finally:
        server.stop()
        server.kill()
    db = sqlite3.connect(folder / "index.db")
    left = db.execute("SELECT count(*) FROM blocks WHERE namespace = ?", (NS,)).fetchone()[0]
    db.close()
    return {
        "startup_s": server.started_s,
        "reconciled_s": reconciled_s,
        "reconcile_report": report,
        "first_request_ttft_s": ttft,
        "rows_left": left,
    }


def primed(work: Path) -> Path:
    """A folder a server has started on once: its index holds the model's weight digest.

    Copied into each size's fresh index, so no start pays for hashing the weights (a
    first start on a new folder does) and start-up differs only by the rows.
    """
    folder = work / "primed"
    db_upgrade(folder)
    server = omlx_server(free_port(), folder, work / "serve-primed.log")
    server.start()
    server.stop()
    return folder / "index.db"


def new_folder(folder: Path, template: Path) -> float:
    """``omlx db upgrade``, then the primed index's weight digests and namespaces copied in."""
    seconds = db_upgrade(folder)
    db = sqlite3.connect(folder / "index.db")
    with db:
        db.execute("ATTACH DATABASE ? AS primed", (str(template),))
        for t in ("weight_digests", "namespaces", "namespace_hosts"):
            db.execute(f"INSERT INTO {t} SELECT * FROM primed.{t}")
    db.execute("DETACH DATABASE primed")
    db.close()
    return seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(x) for x in args.rows.split(",")]
    work = Path(tempfile.mkdtemp(prefix="omlx-index-scale-"))
    result: dict[str, Any] = {
        "machine": machine_note(),
        "versions": versions(),
        "args": vars(args),
        "load_average_start": load_average(),
        "sizes": [],
    }
    print(
        f"machine: {result['machine']}; load {result['load_average_start']}; work in {work}",
        flush=True,
    )
    try:
        template = primed(work)
        result["baseline_server"] = server_start(template.parent, work)
        print(f"server on an index without bench rows: {result['baseline_server']}", flush=True)
        for rows in sizes:
            entry: dict[str, Any] = {"rows": rows}
            folder = work / f"rows-{rows}"
            entry["db_upgrade_s"] = new_folder(folder, template)
            entry.update(fill(folder, rows, orphans=False))
            print(
                f"{rows} rows: inserted in {entry['insert_s']:.1f} s, index {entry['index_mb']:.0f} MB",
                flush=True,
            )
            entry["lookups_ms"] = lookups(folder, rows, args.reps)
            entry["lookups_ms"] |= long_prompt_lookups(folder, rows, max(args.reps // 4, 10))
            for name, s in entry["lookups_ms"].items():
                print(f"  {name}: {fmt_spread(s, 'ms')}", flush=True)
            entry["server"] = server_start(folder, work)
            print(f"  server: {entry['server']}", flush=True)
            shutil.rmtree(folder, ignore_errors=True)
            if not args.no_orphans:
                folder = work / f"orphans-{rows}"
                new_folder(folder, template)
                fill(folder, rows, orphans=True)
                entry["server_orphans"] = server_start(folder, work)
                print(f"  server, rows without files: {entry['server_orphans']}", flush=True)
                shutil.rmtree(folder, ignore_errors=True)
            result["sizes"].append(entry)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    result["load_average_end"] = load_average()
    return result


def report(result: dict[str, Any]) -> None:
    names = list(result["sizes"][0]["lookups_ms"])
    rows = [
        [
            f"{e['rows']:,}",
            f"{e['index_mb']:.0f} MB",
            f"{e['insert_s']:.1f} s",
            *(
                f"{e['lookups_ms'][n]['median']:.3f} / {e['lookups_ms'][n].get('p99', e['lookups_ms'][n]['max']):.3f}"
                for n in names
            ),
        ]
        for e in result["sizes"]
    ]
    print("\nIndex lookups, ms: median / p99 (first after a drop: one call)")
    print(table(["rows", "index.db", "SQL insert", *names], rows))
    base = result["baseline_server"]
    srows = [
        [
            "0",
            "no rows (baseline)",
            f"{base['startup_s']:.2f} s",
            f"{base['reconciled_s']:.2f} s" if base["reconciled_s"] else "-",
            f"{base['first_request_ttft_s']:.3f} s",
            "0",
        ]
    ]
    for e in result["sizes"]:
        for label, key_ in (
            ("rows with files", "server"),
            ("rows without files", "server_orphans"),
        ):
            s = e.get(key_)
            if s:
                srows.append(
                    [
                        f"{e['rows']:,}",
                        label,
                        f"{s['startup_s']:.2f} s",
                        f"{s['reconciled_s']:.2f} s" if s["reconciled_s"] else "-",
                        f"{s['first_request_ttft_s']:.3f} s",
                        f"{s['rows_left']:,}",
                    ]
                )
    print("\nServer start on the folder (spawn -> /health 200; spawn -> reconcile logged)")
    print(
        table(
            ["rows", "case", "start-up", "reconcile done", "first request TTFT", "rows left"], srows
        )
    )
    last = result["sizes"][-1]
    get = last["lookups_ms"]["get_blocks, 32 stored"]
    added = last["server"]["startup_s"] - base["startup_s"]
    verdicts = [
        f"lookup of a 32-block chain at {last['rows']:,} rows: {get['median']:.3f} ms median, p99 {get['p99']:.3f} ms (target < 1 ms) {'MET' if get['median'] < 1 else 'MISSED'}",
        f"start-up at {last['rows']:,} rows: {last['server']['startup_s']:.2f} s, {added:+.2f} s against an index without them "
        f"(target < 2 s, read as what the index adds) {'MET' if added < 2 else 'MISSED'}; "
        f"the whole start-up {'is' if last['server']['startup_s'] < 2 else 'is not'} under 2 s",
    ]
    for name in ("64k prompt, all in RAM", "64k prompt, new"):
        got = last["lookups_ms"][name]
        verdicts.append(
            f"lookup of a {name} at {last['rows']:,} rows: {got['median']:.2f} ms median, p99 {got['p99']:.2f} ms "
            f"(target <= 5 ms) {'MET' if got['median'] <= 5 else 'MISSED'}"
        )
    got = last["lookups_ms"]["64k prompt, on disk: keys + index rows"]
    verdicts.append(
        f"a 64k-token disk hit's keys + 1,024 index rows at {last['rows']:,} rows: {got['median']:.2f} ms median "
        f"(target <= 5 ms) {'MET' if got['median'] <= 5 else 'MISSED'}; its reads follow"
    )
    result["verdicts"] = verdicts
    print("\n".join(verdicts))


def plot(result: dict[str, Any]) -> None:
    sizes = result["sizes"]
    xs = [e["rows"] for e in sizes]
    names = list(sizes[0]["lookups_ms"])
    lookup = {n: [e["lookups_ms"][n] for e in sizes] for n in names if not n.startswith("first")}

    def point(e: dict, key_: str, field: str):
        s = e.get(key_)
        return summarize([s[field]]) if s and s.get(field) is not None else None

    base = result["baseline_server"]["startup_s"]
    start = {
        "start-up, no bench rows": [summarize([base]) for _ in sizes],
        "start-up (files)": [point(e, "server", "startup_s") for e in sizes],
        "reconcile done (files)": [point(e, "server", "reconciled_s") for e in sizes],
        "start-up (no files)": [point(e, "server_orphans", "startup_s") for e in sizes],
        "reconcile done (no files)": [point(e, "server_orphans", "reconciled_s") for e in sizes],
    }
    plots.line_panels(
        out_path("index_scale", ".png"),
        "SQLite index scale: request-path lookups and server start",
        [
            {
                "x": xs,
                "series": lookup,
                "xlabel": "rows in the index",
                "ylabel": "ms per call (median, band min-max)",
                "logx": True,
                "logy": True,
                "title": "lookups",
            },
            {
                "x": xs,
                "series": start,
                "xlabel": "rows in the index",
                "ylabel": "seconds from spawn",
                "logx": True,
                "title": "server start",
            },
        ],
        note=f"omlx {result['versions']['omlx']}; {result['machine']}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="10000,100000,1000000")
    parser.add_argument("--reps", type=int, default=200, help="timed calls of each lookup per size")
    parser.add_argument(
        "--no-orphans", action="store_true", help="skip the rows-without-files start"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="default: bench/out/index_scale.json"
    )
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    t0 = time.perf_counter()
    result = run(args)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    report(result)
    write_json("index_scale", result, args.json)
    plot(result)


if __name__ == "__main__":
    main()
