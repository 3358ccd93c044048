"""``omlx admin cache ...`` and ``omlx db upgrade``: look after a cache folder from the shell.

Never imports Litestar or MLX (a test checks), and is safe beside running servers:
without the folder's lock, or with a shared index, it leaves alone any file or row
younger than a minute. ``--index-url`` points at a shared PostgreSQL index.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

import click

from omlx.adapters.blockfiles.budget import default_reserve
from omlx.adapters.blockfiles.hot_set_file import saved_hot_sets
from omlx.adapters.blockfiles.lock import lock_holder
from omlx.adapters.blockfiles.maintenance import (
    LIVE_GRACE_S,
    remove_blocks,
    verify,
)
from omlx.adapters.sqlindex import SqlBlockIndex, current_revision, index_path, upgrade
from omlx.app.cache_controls.maintenance import clear_blocks, count, vacuum_blocks
from omlx.app.ops.admin_target import (
    Target,
    block_store_option,
    cache_dir_option,
    friendly_errors,
    index_url_option,
    owned_or_shared,
)
from omlx.app.progress import track
from omlx.domain.cache.hot_set import HotSet
from omlx.domain.json_values import JsonObject
from omlx.domain.sizes import format_bytes, parse_size

T = TypeVar("T")


def _progress(items: Iterable[T], length: int | None, label: str) -> Iterable[T]:
    """A bar on a terminal, plain lines otherwise; on stderr, so stdout stays clean."""
    return track(items, length, label, stream=sys.stderr)


@click.group("admin")
def admin_group() -> None:
    """Maintenance of the block cache."""


@admin_group.group("cache")
def cache_group() -> None:
    """Inspect, check, tidy or clear a cache folder."""


@click.group("db")
def db_group() -> None:
    """The index's schema (SQLite or PostgreSQL)."""


@cache_group.command("stats")
@cache_dir_option
@index_url_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@friendly_errors
def stats_command(cache_dir: Path, index_url: str | None, as_json: bool) -> None:
    """Blocks, tokens and bytes per model, the disk's free space and the server's state."""
    target = Target.of(cache_dir, index_url)
    index = target.existing_index()
    try:
        report = _stats(target, index)
    finally:
        if index is not None:
            index.close()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    server = report["server_pid"]
    click.echo(f"cache folder: {report['cache_dir']}")
    if report["index"]["shared"]:
        click.echo("server:       shared index (servers on other hosts hold no lock here)")
    else:
        running = (
            f"running, pid {server}" if server else "running" if server == 0 else "not running"
        )
        click.echo(f"server:       {running}")
    click.echo(
        f"index:        {report['index']['path']} (revision {report['index']['revision']}, "
        f"{format_bytes(report['index']['nbytes'])})"
    )
    for ns in report["namespaces"]:
        images = (
            f" (of which the rows of {count(ns['image_objects'], 'image')}, "
            f"{format_bytes(ns['image_bytes'])})"
            if ns["image_objects"]
            else ""
        )
        click.echo(
            f"  {ns['model_name']} [{ns['namespace'][:12]}]: {count(ns['blocks'], 'block')}"
            f"{images}, {count(ns['tokens'], 'token')}, {format_bytes(ns['nbytes'])}, "
            f"{ns['kv_dtype']} {_per_token(ns['bytes_per_token'])}, "
            f"last used {_ago(ns['newest_access'] or ns['last_used_at'])}"
        )
        for hot in ns["hot_sets"]:
            click.echo(
                f"    hot set{hot['server'] and ' of ' + hot['server']}: "
                f"{count(hot['blocks'], 'block')}, {format_bytes(hot['nbytes'])}, recorded "
                f"{_ago(hot['recorded_at'])} (the next start reads it back into RAM)"
            )
    total, disk = report["total"], report["disk"]
    click.echo(
        f"total:        {count(total['blocks'], 'block')}, {count(total['tokens'], 'token')}, "
        f"{format_bytes(total['nbytes'])}"
    )
    if report["computed_by"]:
        shares = (
            f"{c['server'] or 'unknown'} {count(c['blocks'], 'block')} {format_bytes(c['nbytes'])}"
            for c in report["computed_by"]
        )
        click.echo(f"computed by:  {'; '.join(shares)}")
    prepared = report["prepared_weights"]
    if prepared["copies"]:
        click.echo(
            f"prepared:     {prepared['copies']} float32 GGUF copies, "
            f"{format_bytes(prepared['nbytes'])} in {prepared['path']}"
        )
    if disk:
        click.echo(
            f"disk:         {format_bytes(disk['free'])} free of {format_bytes(disk['total'])} "
            f"(reserve {format_bytes(disk['reserve'])})"
        )


def _hot_sets_of(namespace: str, hot_sets: dict[str, HotSet]) -> list[JsonObject]:
    """The saved hot sets of ``namespace``: ``<namespace>[.<server>].json``."""
    found = []
    for name, hot_set in hot_sets.items():
        if hot_set.namespace != namespace:
            continue
        server = name.removesuffix(".json").removeprefix(namespace).removeprefix(".")
        found.append(
            {
                "server": server,
                "blocks": len(hot_set.entries),
                "nbytes": hot_set.nbytes,
                "recorded_at": hot_set.recorded_at,
            }
        )
    return found


def _per_token(nbytes: float | None) -> str:
    return "-" if nbytes is None else f"{format_bytes(int(nbytes))}/token"


def _stats(target: Target, index: SqlBlockIndex | None) -> JsonObject:
    cache_dir = target.cache_dir
    namespaces: list[JsonObject] = []
    hot_sets = saved_hot_sets(cache_dir.expanduser())
    if index is not None:
        usage = {u.namespace: u for u in index.usage()}
        for rec in index.namespace_records():
            u = usage.get(rec.info.digest)
            namespaces.append(
                {
                    "namespace": rec.info.digest,
                    "model_name": rec.info.model_name,
                    "model_path": rec.info.model_path,
                    "block_size": rec.info.block_size,
                    "kv_dtype": rec.info.kv_dtype,
                    "blocks": u.blocks if u else 0,
                    "tokens": u.tokens if u else 0,
                    "nbytes": u.nbytes if u else 0,
                    # of those blocks: a VLM's image rows (its encoder's output per image)
                    "image_objects": u.image_objects if u else 0,
                    "image_bytes": u.image_bytes if u else 0,
                    # What a token costs on disk here: kv_dtype says how blocks are stored.
                    "bytes_per_token": round(u.nbytes / u.tokens, 1) if u and u.tokens else None,
                    "oldest_access": u.oldest_access if u else None,
                    "newest_access": u.newest_access if u else None,
                    "created_at": rec.created_at,
                    "last_used_at": rec.last_used_at,
                    # Warm restart's record of what RAM held (per server on a shared folder).
                    "hot_sets": _hot_sets_of(rec.info.digest, hot_sets),
                }
            )
    disk: dict[str, int] = {}
    if cache_dir.expanduser().is_dir():
        du = shutil.disk_usage(cache_dir.expanduser())
        disk = {"total": du.total, "free": du.free, "reserve": default_reserve(du.total)}
    if target.shared:
        nbytes = index.storage_bytes() if index is not None else 0
    else:
        db = index_path(cache_dir)
        nbytes = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    return {
        "cache_dir": str(cache_dir.expanduser()),
        "server_pid": lock_holder(cache_dir),
        "index": {
            "path": target.label,
            "shared": target.shared,
            "revision": current_revision(target.url),
            "nbytes": nbytes,
        },
        "namespaces": namespaces,
        "total": {k: sum(ns[k] for ns in namespaces) for k in ("blocks", "tokens", "nbytes")},
        # Which server computed the blocks (None: rows from before that was kept, imports).
        "computed_by": [
            {"server": by, "blocks": n, "nbytes": nbytes}
            for by, n, nbytes in (index.usage_by_computer() if index is not None else ())
        ],
        "prepared_weights": _prepared_weights(cache_dir.expanduser()),
        "disk": disk,
    }


def _prepared_weights(cache_dir: Path) -> JsonObject:
    """The dequantized GGUF copies kept beside the blocks (``adapters/mlx/models/prepared.py``)."""
    from omlx.adapters.mlx.models.prepared_folder import PREPARED_DIR, list_copies

    copies = list_copies(cache_dir / PREPARED_DIR)
    return {
        "path": str(cache_dir / PREPARED_DIR),
        "copies": len(copies),
        "nbytes": sum(c.nbytes for c in copies),
    }


@cache_group.command("verify")
@cache_dir_option
@index_url_option
@block_store_option
@click.option("--fix", is_flag=True, help="Remove bad blocks (rows first, then files).")
@friendly_errors
def verify_command(cache_dir: Path, index_url: str | None, block_store: str, fix: bool) -> None:
    """Read every indexed block, check its checksum, that its tokens rehash to its key, and
    that it holds what its model computes (layers, shapes, dtypes, token count and ids,
    finite values) as a server recorded it.

    Exits 1 when any block is bad (also with --fix, which removes them).
    """
    target = Target.of(cache_dir, index_url, block_store)
    index = target.existing_index()
    if index is None:
        click.echo(f"no cache index in {target.label}; nothing to verify")
        return
    store = target.open_store()
    try:
        checked = index.block_count()
        unknown = [r.info.model_name for r in index.namespace_records() if not r.info.block_spec]
        bad = verify(index, store, _progress)
        for block, problem in bad:
            click.echo(f"BAD {block.key} {block.relpath}: {problem}")
        if bad and fix:
            freed = remove_blocks(index, store, [b for b, _ in bad])
            click.echo(f"removed {len(bad)} bad blocks ({format_bytes(freed)})")
    finally:
        index.close()
    if unknown:
        click.echo(
            f"no block spec recorded for {', '.join(sorted(set(unknown)))}: its blocks were "
            "checked for checksum and key only (a server using the model records one)"
        )
    click.echo(f"checked {checked} blocks: {len(bad)} bad")
    if bad:
        sys.exit(1)


@cache_group.command("vacuum")
@cache_dir_option
@click.option(
    "--max-size",
    help="Also evict LRU blocks beyond this size, e.g. 50GB.",
    envvar="OMLX_PAGED_SSD_CACHE_MAX_SIZE",
    show_envvar=True,
)
@click.option(
    "--unused-namespaces",
    is_flag=True,
    help="Drop models whose folder is gone or that went unused for --unused-days.",
)
@click.option("--unused-days", type=float, default=30.0, show_default=True)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=LIVE_GRACE_S,
    show_default=True,
    help="Beside live servers: spare files and rows younger than this many seconds.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0),
    default=LIVE_GRACE_S,
    show_default=True,
    help="With a shared index: never evict blocks any server used within this many seconds.",
)
@index_url_option
@block_store_option
@friendly_errors
def vacuum_command(
    cache_dir: Path,
    max_size: str | None,
    unused_namespaces: bool,
    unused_days: float,
    grace: float,
    lease: float,
    index_url: str | None,
    block_store: str,
) -> None:
    """Reconcile files and rows, enforce the budget, drop stale temp files, compact the index."""
    try:
        max_bytes = parse_size(max_size) if max_size else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--max-size") from None
    if not cache_dir.expanduser().is_dir():
        click.echo(f"no cache folder at {cache_dir}; nothing to do")
        return
    target = Target.of(cache_dir, index_url, block_store)
    store = target.open_store()
    with owned_or_shared(target, grace) as spare:
        index = target.open_index()
        try:
            freed = vacuum_blocks(
                index,
                store,
                grace=spare,
                max_bytes=max_bytes,
                unused_namespaces=unused_namespaces,
                unused_days=unused_days,
                # Beside a live server the grace spares its recent blocks from eviction
                # too, as the line above promised; a shared index has its lease.
                lease=lease if target.shared else spare,
                say=click.echo,
                progress=_progress,
            )
            if freed is None:
                raise click.ClickException(
                    "another server or admin is reconciling this shared cache; try again later"
                )
            _compact(target, index, owned=spare is None)
        finally:
            index.close()
    click.echo(f"freed {format_bytes(freed)} of block files")


def _compact(target: Target, index: SqlBlockIndex, *, owned: bool) -> None:
    if target.shared:
        index.vacuum()  # VACUUM ANALYZE takes no lock that stops the servers
        click.echo("index vacuumed (VACUUM ANALYZE)")
        return
    if not owned:
        # VACUUM holds the write lock for as long as it takes: a live server's
        # writer would time out and drop blocks. Compact once it has stopped.
        click.echo("index not compacted while a server runs")
        return
    db = index_path(target.cache_dir)
    before = db.stat().st_size
    index.vacuum()
    after = db.stat().st_size
    click.echo(f"index compacted: {format_bytes(before)} -> {format_bytes(after)}")


@cache_group.command("clear")
@cache_dir_option
@click.option(
    "--model", "model", help="Only this model's blocks (its name as `cache stats` shows)."
)
@click.option("--yes", is_flag=True, help="Really delete.")
@index_url_option
@block_store_option
@friendly_errors
def clear_command(
    cache_dir: Path, model: str | None, yes: bool, index_url: str | None, block_store: str
) -> None:
    """Delete every cached block, or one model's."""
    if not yes:
        raise click.UsageError("clear deletes cached blocks; pass --yes to confirm")
    target = Target.of(cache_dir, index_url, block_store)
    index = target.existing_index()
    if index is None:
        click.echo(f"no cache index in {target.label}; nothing to clear")
        return
    store = target.open_store()
    try:
        cleared = clear_blocks(index, store, model, progress=_progress)
    except LookupError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        index.close()
    if not target.shared and lock_holder(cache_dir) is None:
        store.prune_empty_dirs()  # with servers running, a new folder may be about to get a file
    click.echo(
        f"cleared {count(cleared.blocks, 'block')} of {count(cleared.namespaces, 'namespace')} "
        f"({format_bytes(cleared.nbytes)})"
    )


@db_group.command("upgrade")
@cache_dir_option
@index_url_option
@friendly_errors
def db_upgrade_command(cache_dir: Path, index_url: str | None) -> None:
    """Create or migrate the index (``<cache-dir>/index.db`` or ``--index-url``) to the newest schema."""
    target = Target.of(cache_dir, index_url)
    before = current_revision(target.url)
    upgrade(target.url)
    after = current_revision(target.url)
    click.echo(f"index {target.label}: revision {before or 'none'} -> {after}")


def _ago(at: float | None) -> str:
    if not at:
        return "never"
    seconds = max(0.0, time.time() - at)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _add_live_commands() -> None:
    """The commands that ask a running server (``admin_live``) join the cache group."""
    from omlx.app.ops.admin_live import COMMANDS

    for command in COMMANDS:
        cache_group.add_command(command)


_add_live_commands()
