"""Restore rate of a long prefix from omlx's block files against the disk's sequential read rate.

    .venv/bin/python bench/restore.py [--tokens 2048] [--block-size 64] [--kv-bits off|8|4] [--rounds 3] [--dir DIR]
                                      [--json OUT]

Prefills the default model once on a prompt of real source text (the recompute cost),
cuts the KV cache into blocks with omlx's codec, writes them through omlx's block writer
(temp file, fsync, rename, index row), then per round, each after dropping the page cache:
(a) restore: ``ColdTier.get_many`` over the chain (one index query, files read and checksummed
on read threads while this thread decodes and rehashes in order) and ``MLXKVCodec.assemble``
into one mlx cache; (a') the same with ``ColdTier.get`` per block, serially (the path before
``get_many``); (b) a plain sequential read of the same files in the same order; (c) ``cat``
of the same files to /dev/null, one process (the dd-style read, outside Python). Prints
MB/s and the ratio of (a) to (b) (target >= 50%), and restore time next to recompute
time (DESIGN §6: a disk hit must beat recomputing). Where the page cache cannot be
dropped (not root), every rate is a page-cache rate and the output says so. Writes
``bench/out/restore.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plots
from common import (
    ROOT,
    drop_page_cache,
    load_average,
    machine_note,
    meminfo_cached_mb,
    table,
    versions,
)
from summary import out_path, summarize, write_json

from omlx.adapters.mlx.models.blas import describe_blas, load_optimized_blas

load_optimized_blas()

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from omlx.adapters.blockfiles import DiskBudget, FileBlockStore  # noqa: E402
from omlx.adapters.blockfiles.writer import BlockWriter  # noqa: E402
from omlx.adapters.mlx.cache.codec import MLXKVCodec  # noqa: E402
from omlx.adapters.mlx.cache.expected_blocks import expected_blocks  # noqa: E402
from omlx.adapters.mlx.models.loader import load_model  # noqa: E402
from omlx.adapters.sqlindex import open_index  # noqa: E402
from omlx.domain.cache.blocks import BlockMeta, NamespaceInfo  # noqa: E402
from omlx.domain.cache.cold_tier import ColdTier  # noqa: E402
from omlx.domain.cache.hot_tier import HotTier  # noqa: E402
from omlx.domain.cache.keys import chain_keys  # noqa: E402
from omlx.domain.cache.kv_quant import kv_quant_of  # noqa: E402
from omlx.domain.cache.prefix_cache import PrefixCache  # noqa: E402

MB = 1e6
_LAYOUT: list[Any] = []  # the loaded model's cache layout, set once in main()
_KV_QUANT: list[Any] = [None]  # --kv-bits: blocks stored quantized (KVQuant), set in main()


def codec_of_model() -> MLXKVCodec:
    """A codec over the model's layout (a fresh codec cannot assemble before it has cut)."""
    return MLXKVCodec(_LAYOUT[0], _KV_QUANT[0])


def prompt_tokens(model: Any, n: int) -> list[int]:
    """``n`` tokens of this repository's own source text."""
    text = ""
    for path in sorted((ROOT / "src/omlx").rglob("*.py")):
        text += f"\n# file: {path.relative_to(ROOT)}\n" + path.read_text()
        tokens = model.tokenizer.encode(text)
        if len(tokens) >= n:
            return list(tokens[:n])
    raise SystemExit(f"the source tree has fewer than {n} tokens")


def prefill(model: Any, tokens: list[int], step: int) -> tuple[list[Any], float]:
    """A fresh cache holding ``tokens``, computed ``step`` tokens at a time, and the seconds it took."""
    cache = make_prompt_cache(model.model)
    t0 = time.perf_counter()
    for start in range(0, len(tokens), step):
        logits = model.model(mx.array([tokens[start : start + step]]), cache=cache)
        mx.eval(logits, [c.state for c in cache])
    return cache, time.perf_counter() - t0


def random_cache(model: Any, n: int) -> list[Any]:
    """A cache holding ``n`` positions of random KV in the model's shapes and dtype."""
    cache = make_prompt_cache(model.model)
    probe = make_prompt_cache(model.model)
    model.model(mx.array([[1]]), cache=probe)  # one token: each layer's KV shape and dtype
    for c, p in zip(cache, probe, strict=True):
        k, v = p.keys, p.values
        shape = (*k.shape[:2], n, k.shape[3])
        c.update_and_fetch(
            mx.random.normal(shape).astype(k.dtype),
            mx.random.normal((*shape[:3], v.shape[3])).astype(v.dtype),
        )
    mx.eval([c.state for c in cache])
    return cache


def write_blocks(
    cache: list[Any], tokens: list[int], ns: NamespaceInfo, store, index
) -> tuple[list[BlockMeta], float, float]:
    """Split, encode and write every full block through omlx's writer; returns metas and times."""
    codec = codec_of_model()
    writer = BlockWriter(store, index, DiskBudget(store.root, max_bytes=10**13, reserve_bytes=0))
    metas: list[BlockMeta] = []
    parent = ns.digest
    bs = ns.block_size
    t0 = time.perf_counter()
    for i, key in enumerate(chain_keys(ns.digest, tokens, bs)):
        meta = BlockMeta(key=key, parent_key=parent, namespace=ns.digest, token_count=bs)
        block_tokens = tokens[i * bs : (i + 1) * bs]
        payload = codec.split(cache, i * bs, (i + 1) * bs)
        if not writer.submit(meta, ns, codec.encode(payload, block_tokens, meta)):
            raise SystemExit(f"the writer dropped block {i}")
        metas.append(meta)
        parent = key
    encode_s = time.perf_counter() - t0
    if not writer.close(timeout=600):
        raise SystemExit("the writer did not drain")
    stats = writer.stats()
    if stats.written != len(metas):
        raise SystemExit(f"the writer wrote {stats['written']} of {len(metas)} blocks: {stats}")
    return metas, encode_s, stats.write_seconds


def restore_cold_tier(tier: ColdTier, metas: list[BlockMeta]) -> tuple[list[Any], float]:
    """(a) omlx's cold read path: ColdTier.get_many over the chain, then one assemble."""
    codec = codec_of_model()
    t0 = time.perf_counter()
    payloads = [payload for _, payload in tier.get_many([(m.key, m.parent_key) for m in metas])]
    if len(payloads) != len(metas):
        raise SystemExit(f"{len(payloads)} of {len(metas)} blocks were served: {tier.stats()}")
    restored = codec.assemble(payloads)
    return restored, time.perf_counter() - t0


def restore_serial(tier: ColdTier, metas: list[BlockMeta]) -> tuple[list[Any], float]:
    """(a') ColdTier.get per block in chain order (no read-ahead), then one assemble."""
    codec = codec_of_model()
    t0 = time.perf_counter()
    payloads = []
    for meta in metas:
        found = tier.get(meta.key, meta.parent_key)
        if found is None:
            raise SystemExit(f"block {meta.key} was not served: {tier.stats()}")
        payloads.append(found[1])
    restored = codec.assemble(payloads)
    return restored, time.perf_counter() - t0


def restore_prefix_cache(tier: ColdTier, ns: NamespaceInfo, tokens: list[int]) -> tuple[int, float]:
    """What a request does after a restart: its session's lookup (empty RAM tier), then restore."""
    cache = PrefixCache(namespace=ns, codec=codec_of_model(), hot=HotTier(10**11), cold=tier)
    t0 = time.perf_counter()
    session = cache.begin([*tokens, 0])  # one extra token: lookup always leaves one to compute
    session.restore()
    elapsed = time.perf_counter() - t0
    session.close()
    return session.cached_tokens, elapsed


def sequential_read(paths: list[Path]) -> tuple[int, float]:
    """(b) the disk's own rate: read the same files whole, in the same order."""
    t0 = time.perf_counter()
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            total += len(f.readall())
    return total, time.perf_counter() - t0


def cat_read(paths: list[Path]) -> float:
    """(c) ``cat FILES > /dev/null``: the same bytes read by a plain tool, in one process."""
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def breakdown(tier_store: FileBlockStore, index, metas: list[BlockMeta]) -> dict[str, float]:
    """Where restore time goes with the files in the page cache: read, checksum, decode, assemble."""
    codec = codec_of_model()
    rows = index.get_blocks([m.key for m in metas])
    t = {"read": 0.0, "sha256": 0.0, "decode": 0.0, "assemble": 0.0}
    payloads = []
    for meta in metas:
        t0 = time.perf_counter()
        data = tier_store.read(rows[meta.key].relpath)
        t1 = time.perf_counter()
        hashlib.sha256(data).hexdigest()
        t2 = time.perf_counter()
        payloads.append(codec.decode(data).payload)
        t3 = time.perf_counter()
        t["read"] += t1 - t0
        t["sha256"] += t2 - t1
        t["decode"] += t3 - t2
    t0 = time.perf_counter()
    codec.assemble(payloads)
    t["assemble"] = time.perf_counter() - t0
    return t


def same_cache(a: list[Any], b: list[Any], n: int) -> bool:
    """Bit for bit; with --kv-bits, within the quantization's error (store-only mode)."""
    if _KV_QUANT[0] is not None:
        tolerance = 0.5 if _KV_QUANT[0].bits == 4 else 0.1
        return all(
            float(mx.abs(x.keys[..., :n, :] - y.keys[..., :n, :]).max())
            < tolerance * float(mx.abs(y.keys[..., :n, :]).max())
            for x, y in zip(a, b, strict=True)
        )
    return all(
        bool(mx.array_equal(x.keys[..., :n, :], y.keys[..., :n, :]))
        and bool(mx.array_equal(x.values[..., :n, :], y.values[..., :n, :]))
        for x, y in zip(a, b, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, default=2048, help="prefix length (a multiple of the block size)"
    )
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument(
        "--kv-bits", default="off", choices=["off", "8", "4"], help="store blocks quantized"
    )
    parser.add_argument(
        "--prefill-step", type=int, default=256, help="tokens per prefill step (omlx's default)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--model",
        default=None,
        help="a model folder or GGUF (default: the default model), e.g. a bench model",
    )
    parser.add_argument(
        "--random-kv",
        action="store_true",
        help="fill the cache with random KV instead of prefilling (the bytes are what a restore costs; "
        "the recompute time is then not measured)",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="cache folder (default: a temp folder under /tmp)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    result: dict[str, Any] = {
        "machine": machine_note(),
        "blas": describe_blas(),
        "args": vars(args),
    }
    result["load_average_start"] = load_average()
    print(
        f"machine: {result['machine']}; load average {result['load_average_start']}\n{result['blas']}",
        flush=True,
    )
    model = load_model(args.model)
    _LAYOUT.append(model.layout)
    tokens = prompt_tokens(model, args.tokens)
    n = len(tokens) - len(tokens) % args.block_size
    _KV_QUANT[0] = kv_quant_of(args.kv_bits)
    result["kv_bits"] = args.kv_bits
    ns = model.namespace(args.block_size, _KV_QUANT[0])
    print(
        f"model {model.model_id}: {model.layer_count} layers, KV {model.kv_dtype}; prefix {n} tokens",
        flush=True,
    )

    if args.random_kv:
        cache, recompute_s = random_cache(model, len(tokens)), None
        print(
            f"random KV for {len(tokens)} tokens (no prefill: recompute not measured)", flush=True
        )
    else:
        print(
            f"recompute: prefilling {len(tokens)} tokens, {args.prefill_step} per step ...",
            flush=True,
        )
        cache, recompute_s = prefill(model, tokens, args.prefill_step)
        print(f"  {recompute_s:.2f} s ({len(tokens) / recompute_s:.0f} tok/s)", flush=True)

    root = args.dir or Path(tempfile.mkdtemp(prefix="omlx-restore-bench-", dir="/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    store = FileBlockStore(root)
    index = open_index(root)
    try:
        metas, encode_s, write_s = write_blocks(cache, tokens[:n], ns, store, index)
        rows = index.get_blocks([m.key for m in metas])
        paths = [store.path(rows[m.key].relpath) for m in metas]
        nbytes = sum(p.stat().st_size for p in paths)
        print(
            f"wrote {len(metas)} block files, {nbytes / MB:.1f} MB ({nbytes / len(metas) / MB:.2f} MB each) to {root}: "
            f"split+encode {encode_s:.2f} s, writer (write+fsync+rename+row) {write_s:.2f} s "
            f"= {nbytes / MB / write_s:.0f} MB/s",
            flush=True,
        )
        # The server's read path: each file's header checked against the model's block spec.
        checker = codec_of_model()
        checker.expected = expected_blocks(model.model, checker, args.block_size)
        tier = ColdTier(
            ns, store, index, writer=_NoWriter(), decode=checker.decode, check=checker.check
        )

        # One restore first (files still in the page cache from the write): one-time costs of
        # the first SQLite query and MLX/numpy paths stay out of the timed rounds; checks the result.
        restored, first_s = restore_cold_tier(tier, metas)
        if not same_cache(restored, cache, n):
            raise SystemExit("the restored cache differs from the computed one")
        del restored
        restored, _ = restore_serial(tier, metas)
        if not same_cache(restored, cache, n):
            raise SystemExit("the serially restored cache differs from the computed one")
        del restored
        print(
            f"first restore in this process (page cache warm, checked equal to the prefill): {first_s:.3f} s",
            flush=True,
        )
        before = meminfo_cached_mb()
        dropped = drop_page_cache()
        after = meminfo_cached_mb()
        if dropped:
            print(f"page cache dropped: Cached {before:.0f} -> {after:.0f} MB", flush=True)
        else:
            print("page cache: cannot drop (not root?): the reads below may come from RAM")
        rounds = []
        for i in range(args.rounds):
            before = meminfo_cached_mb()
            drop_page_cache()
            after = meminfo_cached_mb()
            restored, restore_s = restore_cold_tier(tier, metas)
            del restored
            drop_page_cache()
            restored, serial_s = restore_serial(tier, metas)
            del restored
            drop_page_cache()
            read_bytes, read_s = sequential_read(paths)
            assert read_bytes == nbytes
            drop_page_cache()
            cat_s = cat_read(paths)
            rounds.append(
                {
                    "restore_s": restore_s,
                    "restore_mb_s": nbytes / MB / restore_s,
                    "serial_s": serial_s,
                    "serial_mb_s": nbytes / MB / serial_s,
                    "read_s": read_s,
                    "read_mb_s": nbytes / MB / read_s,
                    "cat_s": cat_s,
                    "cat_mb_s": nbytes / MB / cat_s,
                    "page_cache_mb_before_drop": before,
                    "page_cache_mb_after_drop": after,
                }
            )
            r = rounds[-1]
            print(
                f"round {i + 1}: restore {restore_s:.3f} s = {r['restore_mb_s']:.0f} MB/s; "
                f"serial gets {serial_s:.3f} s = {r['serial_mb_s']:.0f} MB/s; "
                f"sequential read {read_s:.3f} s = {r['read_mb_s']:.0f} MB/s; "
                f"ratio {r['restore_mb_s'] / r['read_mb_s']:.0%}",
                flush=True,
            )
        drop_page_cache()
        cached, server_path_s = restore_prefix_cache(tier, ns, tokens[:n])
        print(
            f"a CacheSession's lookup + restore after a drop (the server's path): {cached} tokens in {server_path_s:.3f} s",
            flush=True,
        )
        sequential_read(paths)  # files now in the page cache
        _, warm_restore_s = restore_cold_tier(tier, metas)
        parts = breakdown(store, index, metas)
        print(
            f"page cache warm: restore {warm_restore_s:.3f} s = {nbytes / MB / warm_restore_s:.0f} MB/s; "
            + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()),
            flush=True,
        )
        tier.close()
    finally:
        index.close()
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    result["load_average_end"] = load_average()
    print(f"load average at the end: {result['load_average_end']}")
    mbs = {
        f"(a) restore: ColdTier.get_many x{len(metas)} + assemble": summarize(
            r["restore_mb_s"] for r in rounds
        ),
        f"(a') ColdTier.get x{len(metas)}, serial, + assemble": summarize(
            r["serial_mb_s"] for r in rounds
        ),
        "(b) sequential read of the same files": summarize(r["read_mb_s"] for r in rounds),
        "(c) cat of the same files > /dev/null": summarize(r["cat_mb_s"] for r in rounds),
        "CacheSession lookup + restore (server path)": summarize([nbytes / MB / server_path_s]),
        "restore, files already in the page cache": summarize([nbytes / MB / warm_restore_s]),
    }
    restore_med = statistics.median(r["restore_s"] for r in rounds)
    serial_med = statistics.median(r["serial_s"] for r in rounds)
    read_med = statistics.median(r["read_s"] for r in rounds)
    ratio = read_med / restore_med
    rows_out = [
        [
            what,
            f"{nbytes / MB / s['median']:.3f} s",
            f"{s['median']:.0f} MB/s" + (f" ({s['min']:.0f}-{s['max']:.0f})" if s["n"] > 1 else ""),
        ]
        for what, s in mbs.items()
    ]
    if recompute_s is not None:
        rows_out.append(
            [
                f"recompute: prefill {len(tokens)} tokens",
                f"{recompute_s:.3f} s",
                f"{len(tokens) / recompute_s:.0f} tok/s",
            ]
        )
    cache_note = (
        "page cache dropped before each"
        if dropped
        else "PAGE CACHE NOT DROPPED (not root): page-cache rates"
    )
    print(
        f"\nRestore of a {n}-token prefix ({len(metas)} blocks, {nbytes / MB:.1f} MB), median of {args.rounds} rounds (min-max), {cache_note}"
    )
    print(table(["what", "time (median)", "rate"], rows_out))
    verdicts = [
        f"restore rate / sequential read rate: {ratio:.0%} (target >= 50%) {'MET' if ratio >= 0.5 else 'MISSED'}",
    ]
    if recompute_s is not None:
        verdicts.append(
            f"restore vs recompute: {restore_med:.3f} s vs {recompute_s:.2f} s = {recompute_s / restore_med:.0f}x faster to restore"
        )
    if not dropped:
        verdicts.append("page cache could not be dropped: disk rates are page-cache rates")
    print("\n".join(verdicts))
    result.update(
        versions=versions(),
        tokens=n,
        blocks=len(metas),
        bytes=nbytes,
        recompute_s=recompute_s,
        encode_s=encode_s,
        write_s=write_s,
        rounds=rounds,
        mb_per_s=mbs,
        restore_median_s=restore_med,
        serial_median_s=serial_med,
        read_median_s=read_med,
        ratio=ratio,
        first_restore_s=first_s,
        server_path_s=server_path_s,
        warm_restore_s=warm_restore_s,
        warm_breakdown_s=parts,
        page_cache_dropped=dropped,
        verdicts=verdicts,
    )
    write_json("restore", result, args.json)
    short = [
        "(a) restore,\nget_many",
        "(a') restore,\nserial gets",
        "(b) sequential\nread",
        "(c) cat",
        "server path:\nlookup + restore",
        "restore, page\ncache warm",
    ]
    values = list(mbs.values())
    reads = {2, 3}
    plots.grouped_bars(
        out_path("restore", ".png"),
        f"Restoring a {n}-token prefix ({len(metas)} blocks, {nbytes / MB:.0f} MB) from disk: MB/s "
        f"(median of {args.rounds}, whiskers min-max)",
        "MB/s",
        short,
        {
            "omlx": [None if i in reads else v for i, v in enumerate(values)],
            "plain read of the same files": [
                v if i in reads else None for i, v in enumerate(values)
            ],
        },
        overlay=True,
        note=f"omlx {result['versions']['omlx']}; {cache_note}; "
        + (f"recompute {recompute_s:.1f} s; " if recompute_s is not None else "random KV; ")
        + f"{result['machine']}",
    )


class _NoWriter:
    """The read path needs no writer: blocks are already on disk."""

    def submit(self, meta, namespace, data) -> bool:
        return False

    def pending(self, key: str) -> bool:
        return False


if __name__ == "__main__":
    main()
