"""Restore rate of the same blocks from a SeaweedFS bucket on loopback and from the local folder.

    .venv/bin/python bench/object_store.py [--tokens 4096] [--block-size 64] [--rounds 5] [--json OUT]

Cuts a cache of the default model (random KV in its shapes and dtype: the bytes are what
a restore costs) into blocks with omlx's codec, writes them through omlx's block writer
into (1) a cache folder (``FileBlockStore``) and (2) a real ``weed mini`` bucket
(``S3BlockStore``, tests/seaweedfs.py starts it), each with its own SQLite index. Then per
round (5; the folder and the bucket take turns at going first), the page cache dropped
before each restore (SeaweedFS's volume files live on the
same disk, so both read the disk): (a) the folder: ``ColdTier.get_many`` + ``assemble``;
(b) the bucket through a read-through tier with no local copies yet (parallel GETs, each
checked, then kept locally); (b') the bucket alone, no copies kept (what keeping them
costs); (c) the same as (b) again: every block from the local copies, no GET (counted). Prints MB/s and the ratio of (b) to (a) (target >= 0.7x). Writes
``bench/out/object_store.json``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import drop_page_cache, load_average, machine_note, table, versions
from summary import summarize, write_json

from omlx.adapters.mlx.models.blas import describe_blas, load_optimized_blas

load_optimized_blas()

import mlx.core as mx  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402

from omlx.adapters.blockfiles import FileBlockStore  # noqa: E402
from omlx.adapters.blockfiles.budget import SizeBudget  # noqa: E402
from omlx.adapters.blockfiles.writer import BlockWriter  # noqa: E402
from omlx.adapters.mlx.cache.codec import MLXKVCodec  # noqa: E402
from omlx.adapters.mlx.cache.expected_blocks import expected_blocks  # noqa: E402
from omlx.adapters.mlx.models.loader import load_model  # noqa: E402
from omlx.adapters.objectstore import ReadThroughStore, S3BlockStore, S3Location  # noqa: E402
from omlx.adapters.objectstore.s3 import READ_THREADS  # noqa: E402
from omlx.adapters.sqlindex import open_index  # noqa: E402
from omlx.domain.cache.blocks import BlockMeta  # noqa: E402
from omlx.domain.cache.cold_tier import ColdTier  # noqa: E402
from omlx.domain.cache.keys import chain_keys  # noqa: E402
from tests.seaweedfs import SeaweedServer, find_weed  # noqa: E402

MB = 1e6


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


def write_blocks(codec: MLXKVCodec, cache: list[Any], tokens: list[int], ns, stores) -> list:
    """Every full block through omlx's writer into each ``(store, index)``; their metas."""
    writers = [BlockWriter(store, index, SizeBudget(10**13)) for store, index in stores]
    metas: list[BlockMeta] = []
    parent, bs = ns.digest, ns.block_size
    for i, key in enumerate(chain_keys(ns.digest, tokens, bs)):
        meta = BlockMeta(key=key, parent_key=parent, namespace=ns.digest, token_count=bs)
        data = codec.encode(
            codec.split(cache, i * bs, (i + 1) * bs), tokens[i * bs : (i + 1) * bs], meta
        )
        for writer in writers:
            if not writer.submit(meta, ns, data, wait=60):
                raise SystemExit(f"the writer dropped block {i}")
        metas.append(meta)
        parent = key
    for writer in writers:
        if not writer.close(timeout=600) or writer.stats().written != len(metas):
            raise SystemExit(f"a writer did not write every block: {writer.stats()}")
    return metas


def restore(tier: ColdTier, codec: MLXKVCodec, metas: list[BlockMeta]) -> float:
    """The server's read path: one index query, reads checked on read threads, decode, assemble."""
    t0 = time.perf_counter()
    payloads = [p for _, p in tier.get_many([(m.key, m.parent_key) for m in metas])]
    if len(payloads) != len(metas):
        raise SystemExit(f"{len(payloads)} of {len(metas)} blocks were served: {tier.stats()}")
    codec.assemble(payloads)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="prefix length")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--read-threads", type=int, default=READ_THREADS, help="GETs in flight per restore"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    weed, why = find_weed()
    if weed is None:
        raise SystemExit(why)
    result: dict[str, Any] = {
        "machine": machine_note(),
        "blas": describe_blas(),
        "args": vars(args),
    }
    result["load_average_start"] = load_average()
    print(f"machine: {result['machine']}; load average {result['load_average_start']}", flush=True)

    model = load_model(None)
    ns = model.namespace(args.block_size, None)
    codec = MLXKVCodec(model.layout, None)
    n = args.tokens - args.tokens % args.block_size
    tokens = [(i * 7919) % 30000 + 1 for i in range(n)]
    cache = random_cache(model, n)
    codec.expected = expected_blocks(model.model, codec, args.block_size)

    root = Path(tempfile.mkdtemp(prefix="omlx-object-store-bench-", dir="/tmp"))
    server = SeaweedServer(weed, root / "weed").start()
    try:
        folder = FileBlockStore(root / "folder")
        (root / "folder").mkdir()
        folder_index = open_index(root / "folder")
        url = server.new_prefix()
        remote = S3BlockStore(
            S3Location.parse(url), server.access(), read_threads=args.read_threads
        )
        (root / "bucket").mkdir()
        bucket_index = open_index(root / "bucket")
        t0 = time.perf_counter()
        metas = write_blocks(
            codec, cache, tokens, ns, [(folder, folder_index), (remote, bucket_index)]
        )
        nbytes = sum(r.nbytes for r in folder_index.get_blocks([m.key for m in metas]).values())
        print(
            f"wrote {len(metas)} blocks, {nbytes / MB:.1f} MB, to the folder and to {url} "
            f"in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )

        def tier(store: Any, index: Any) -> ColdTier:
            return ColdTier(ns, store, index, _NoWriter(), codec.decode, check=codec.check)

        folder_tier = tier(folder, folder_index)
        plain_tier = tier(remote, bucket_index)
        copies = root / "copies"
        rounds = []
        for i in range(args.rounds + 1):  # the first round warms code paths: not counted
            shutil.rmtree(copies, ignore_errors=True)
            through = ReadThroughStore(
                remote,
                FileBlockStore(copies, durable=False),
                10**12,
                read_threads=args.read_threads,
            )
            bucket_tier = tier(through, bucket_index)
            gets = remote.requests
            # Taking turns at going first: a busy machine's drift falls on both alike.
            for which in ("folder", "bucket") if i % 2 else ("bucket", "folder"):
                drop_page_cache()
                if which == "folder":
                    folder_s = restore(folder_tier, codec, metas)
                else:
                    bucket_s = restore(bucket_tier, codec, metas)
            cold_gets = remote.requests - gets
            through.drain()
            drop_page_cache()
            plain_s = restore(plain_tier, codec, metas)
            through.drain()  # the copies are written off the restore's path; then all on disk
            drop_page_cache()
            gets = remote.requests
            again_s = restore(bucket_tier, codec, metas)
            again_gets = remote.requests - gets
            bucket_tier.close()
            if i == 0:
                continue
            r = {
                "folder_s": folder_s,
                "bucket_s": bucket_s,
                "again_s": again_s,
                "plain_s": plain_s,
                "plain_mb_s": nbytes / MB / plain_s,
                "folder_mb_s": nbytes / MB / folder_s,
                "bucket_mb_s": nbytes / MB / bucket_s,
                "again_mb_s": nbytes / MB / again_s,
                "bucket_gets": cold_gets,
                "again_gets": again_gets,
                "again_local_hits": through.stats().local_hits,
            }
            rounds.append(r)
            print(
                f"round {i}: folder {folder_s:.3f} s = {r['folder_mb_s']:.0f} MB/s; bucket "
                f"{bucket_s:.3f} s = {r['bucket_mb_s']:.0f} MB/s ({cold_gets} GETs); no copies "
                f"{plain_s:.3f} s = {r['plain_mb_s']:.0f} MB/s; again "
                f"{again_s:.3f} s = {r['again_mb_s']:.0f} MB/s ({again_gets} GETs)",
                flush=True,
            )
        folder_tier.close()
        folder_index.close()
        bucket_index.close()
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)

    result["load_average_end"] = load_average()
    ratio = statistics.median(r["folder_s"] for r in rounds) / statistics.median(
        r["bucket_s"] for r in rounds
    )
    rates = {
        "(a) the folder (FileBlockStore)": summarize(r["folder_mb_s"] for r in rounds),
        "(b) the bucket, no local copies (parallel GETs)": summarize(
            r["bucket_mb_s"] for r in rounds
        ),
        "(b') the bucket alone, no copies kept": summarize(r["plain_mb_s"] for r in rounds),
        "(c) the bucket again: local copies": summarize(r["again_mb_s"] for r in rounds),
    }
    print(
        f"\nRestore of a {n}-token prefix ({len(metas)} blocks, {nbytes / MB:.1f} MB), median of "
        f"{len(rounds)} rounds (min-max), page cache dropped before each"
    )
    print(
        table(
            ["what", "time (median)", "rate"],
            [
                [
                    what,
                    f"{nbytes / MB / s['median']:.3f} s",
                    f"{s['median']:.0f} MB/s ({s['min']:.0f}-{s['max']:.0f})",
                ]
                for what, s in rates.items()
            ],
        )
    )
    second_local = all(r["again_gets"] == 0 for r in rounds)
    verdicts = [
        f"bucket restore rate / folder restore rate: {ratio:.2f}x (target >= 0.7x) "
        f"{'MET' if ratio >= 0.7 else 'MISSED'}",
        f"second restore from the read-through copies (0 GETs): {'MET' if second_local else 'MISSED'}",
    ]
    print("\n".join(verdicts))
    result.update(
        versions=versions(),
        tokens=n,
        blocks=len(metas),
        bytes=nbytes,
        rounds=rounds,
        mb_per_s=rates,
        ratio=ratio,
        verdicts=verdicts,
    )
    write_json("object_store", result, args.json)


class _NoWriter:
    """The read path needs no writer: the blocks are stored already."""

    def submit(self, meta, namespace, data, **how) -> bool:
        return False

    def pending(self, key: str) -> bool:
        return False


if __name__ == "__main__":
    main()
