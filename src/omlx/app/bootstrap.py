"""The composition root (STYLE §3): the one place that builds adapters and wires them."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omlx.adapters.mlx.blas import describe_blas, load_optimized_blas, log_blas
from omlx.app.chat import ChatPipeline
from omlx.app.container import Container
from omlx.app.model_loader import SharedCold
from omlx.app.model_names import ModelNames
from omlx.app.normalize import PromptNormalizer
from omlx.app.pool import ModelPool, Served
from omlx.app.responses_store import MemoryResponseStore, ResponseStore
from omlx.app.sealing import ReasoningSeal
from omlx.app.service import GenerationService
from omlx.app.settings import Settings
from omlx.app.templates import ChatRenderer
from omlx.domain.memory import MemoryAccount

log = logging.getLogger(__name__)


def bootstrap(settings: Settings, *, load_in_background: bool = False, **overrides: Any) -> Container:
    """Find the models, open the shared cache tiers, load the models asked for at start.

    ``load_in_background``: only check that those models fit, and leave their loads to
    the app once it listens (``Container.start_loads``), so the port opens in about the
    time the imports take. ``overrides`` replace built parts in tests (``model=``: an
    already loaded model).
    """
    load_optimized_blas()  # before the first import of mlx below
    log_blas()
    from omlx.adapters.mlx.memory import return_freed_memory, total_ram_bytes
    from omlx.app.catalog import CHAT, catalog
    from omlx.app.model_loader import ModelLoader

    closers: list = []
    try:
        specs = catalog(list(settings.model_list), settings.model_dir)
        chat_ids = [s.id for s in specs if s.task == CHAT]
        names = ModelNames(
            [s.id for s in specs], settings.model_aliases, settings.answer_any_model,
            default=chat_ids[0] if chat_ids else None,
        )
        account = MemoryAccount(settings.max_model_memory_bytes(total_ram_bytes()))
        ssd = _open_ssd(settings, closers) if settings.cache_enabled and settings.ssd_cache_enabled else None
        pool_ref: list[ModelPool] = []  # the writer asks the pool, built just below, about pins
        cold = _start_shared_cold(settings, ssd, lambda key: pool_ref[0].is_pinned(key), closers) if ssd else None
        loader = ModelLoader(
            settings, cold, account, _kv_memory_limit(settings),
            digest_cache=_digest_cache(ssd.index) if ssd else None,
        )
        pool = ModelPool(
            specs, names, load=loader.load, estimate=loader.estimate, account=account,
            pinned=settings.pin_models, idle_timeout=settings.model_idle_timeout or None,
            release_memory=return_freed_memory,
        )
        pool_ref.append(pool)
        closers.append(pool.close)  # after the engines stop, the writer drains (closers reversed)
        preloaded = overrides.get("model")
        start_loads = []
        for spec in specs:
            if spec.id in pool.pinned or settings.model_list or len(specs) == 1:
                if preloaded is not None and preloaded.model_id == spec.id:
                    pool.add(_served_chat(settings, spec, preloaded, loader))
                elif load_in_background:
                    pool.check_fits(spec)
                    start_loads.append(spec)
                else:
                    pool.preload(spec)
        seal = ReasoningSeal.for_folder(settings.cache_dir if ssd is not None else None)
        return Container(
            settings=settings,
            pool=pool,
            names=names,
            normalizer=PromptNormalizer(settings.prompt_normalizations),
            seal=seal,
            responses=_response_store(settings, ssd),
            started_at=int(time.time()),
            blas=describe_blas(),
            writer=cold.writer if cold is not None else None,
            closers=closers,
            start_loads=start_loads,
        )
    except BaseException:
        _close_all(closers)
        raise


def _served_chat(settings: Settings, spec: Any, model: Any, loader: Any) -> Served:
    """An already loaded chat model wired as the loader would (tests pass one in)."""
    return loader.wire_chat(spec, model)


def wire_services(
    settings: Settings,
    model: Any,
    engine: Any,
    *,
    seal: ReasoningSeal | None = None,
    responses: ResponseStore | None = None,
    grammars: Any = None,
    **parts: Any,
) -> Container:
    """The app's services over one loaded chat model and a started engine (tests pass fakes)."""
    from omlx.app.catalog import ModelSpec

    generation = GenerationService(
        engine,
        model,
        max_queued=settings.max_queued_requests,
        default_max_tokens=settings.default_max_tokens,
        grammars=grammars,
    )
    served = Served(
        ModelSpec(model.model_id, getattr(model, "path", None)),
        model,
        engine,
        generation=generation,
        chat=ChatPipeline(generation, ChatRenderer(model.tokenizer, model.model_id)),
        prefix_cache=parts.pop("prefix_cache", None),
        cold_tier=parts.pop("cold_tier", None),
    )
    names = ModelNames([model.model_id], settings.model_aliases, settings.answer_any_model)
    pool = ModelPool([served.spec], names)
    pool.add(served)
    return Container(
        settings=settings,
        pool=pool,
        names=names,
        normalizer=PromptNormalizer(settings.prompt_normalizations),
        seal=seal or ReasoningSeal.for_folder(None),
        responses=responses or MemoryResponseStore(settings.responses_retention),
        started_at=int(time.time()),
        **parts,
    )


def _response_store(settings: Settings, ssd: SsdParts | None) -> ResponseStore:
    """Stored responses in the index database when the SSD tier has one, else in memory."""
    if ssd is None:
        log.info("stored responses: in memory (no SSD tier), lost at exit")
        return MemoryResponseStore(settings.responses_retention)
    from omlx.adapters.sqlindex import SqlResponseStore

    return SqlResponseStore(ssd.index.engine, settings.responses_retention)


def _kv_memory_limit(settings: Settings) -> int | None:
    """kv_memory_limit in bytes: a size as given, "auto" as half of physical RAM, "off" as None."""
    if not settings.kv_memory_guard:
        return None
    from omlx.adapters.mlx.memory import auto_limit_bytes

    limit = settings.kv_memory_limit_bytes
    return auto_limit_bytes() if limit is None else limit


def _close_all(closers: list) -> None:
    while closers:
        try:
            closers.pop()()
        except Exception:
            log.exception("error while closing")


@dataclass(frozen=True, slots=True)
class SsdParts:
    """The cold tier's outside things: its folder, index and store, and whether others share them."""

    dir: Path
    index: Any  # SqlBlockIndex
    store: Any  # FileBlockStore
    shared: bool
    server_id: str


def _open_ssd(settings: Settings, closers: list) -> SsdParts:
    """Lock the cache folder (exclusive, or shared with a shared index) and open its index."""
    from sqlalchemy import exc as sa_exc

    from omlx.adapters.blockfiles import CacheDirLock, CacheDirLocked, FileBlockStore
    from omlx.adapters.sqlindex import backend, connect_index, display, index_path, sqlite_url

    cache_dir = settings.cache_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    url = settings.index_url or sqlite_url(index_path(cache_dir))
    shared = backend(url) == "postgresql"
    lock = CacheDirLock(cache_dir, shared=shared)
    try:
        lock.acquire()  # raises CacheDirLocked with the other server's pid
    except CacheDirLocked as exc:
        if not shared:
            raise
        raise RuntimeError(
            f"cache folder {cache_dir} is owned by a server with an embedded index "
            f"(pid {exc.pid or '?'}); servers share a folder only through one --index-url"
        ) from None
    closers.append(lock.release)
    server_id = settings.server_identity
    try:
        index = connect_index(url)
        closers.append(index.close)
        if shared:
            from omlx.adapters.sqlindex.postgres import hold_identity

            closers.append(hold_identity(index.engine, server_id).close)
    except sa_exc.OperationalError as exc:
        first = str(exc.orig or exc).strip().splitlines()[0]
        raise RuntimeError(f"cannot reach the index {display(url)}: {first}") from None
    if shared:
        log.info("shared index %s, as server %s", display(url), server_id)
    store = FileBlockStore(cache_dir, writer_id=server_id)
    closers.append(store.close)  # its read threads, after the writer and the flush
    return SsdParts(cache_dir, index, store, shared, server_id)


def _digest_cache(index: Any):
    """Remember weight digests per (path, size, mtime): hashing large weights is slow."""

    def cached(path: Path, compute) -> str:
        stat = path.stat()
        key = str(path.resolve())
        digest = index.weight_digest_lookup(key, stat.st_size, stat.st_mtime)
        if digest is None:
            digest = compute(path)
            index.weight_digest_store(key, stat.st_size, stat.st_mtime, digest)
        return digest

    return cached


def _start_shared_cold(settings: Settings, ssd: SsdParts, is_pinned: Any, closers: list) -> SharedCold:
    """The writer, recency and start-up reconcile every model's cold tier shares."""
    from omlx.adapters.blockfiles import BlockWriter, DiskBudget
    from omlx.domain.cache.cold_tier import RecencyBuffer

    recency = RecencyBuffer(ssd.index)
    writer = BlockWriter(
        ssd.store,
        ssd.index,
        DiskBudget(ssd.dir, settings.ssd_cache_bytes),
        is_pinned=is_pinned,
        tick=recency.maybe_flush,
        shared=ssd.shared,
        lease=settings.eviction_lease_seconds,
    )
    # Closed in reverse: drain the writer, then flush recency so LRU order survives.
    closers.append(recency.flush)
    closers.append(lambda: writer.close(30))
    # Start-up reads the index, not the folder; the reconcile of what a crash left
    # runs beside serving.
    started = time.time()
    threading.Thread(
        target=_reconcile_quietly, args=(settings, ssd, started), name="omlx-reconcile", daemon=True
    ).start()
    return SharedCold(ssd, writer, recency)


def _reconcile_quietly(settings: Settings, ssd: SsdParts, started: float) -> None:
    """Own folder: every file older than this start is stale (our writer's are younger).

    Shared folder: one server at a time, sparing what is younger than the grace period
    (a peer's write in flight, a file the share does not show us yet), except our own
    temporary files from before this start: no one else writes under our identity.
    """
    from omlx.adapters.blockfiles.maintenance import collect_old_formats, reconcile
    from omlx.app.progress import track

    def progress(items: Any, length: int | None, label: str) -> Any:
        return track(items, length, f"start-up reconcile, {label}", logger=log)

    try:
        since_start = max(time.time() - started, 0.0)
        if not ssd.shared:
            collected = collect_old_formats(ssd.index, ssd.store)
            if collected:
                log.info("collected %d blocks of an older block format", collected)
            report = reconcile(ssd.index, ssd.store, grace=since_start, progress=progress)
        else:
            with ssd.index.maintenance_lock() as ours:
                if not ours:
                    log.info("another server is reconciling the shared cache folder; skipped")
                    return
                report = reconcile(
                    ssd.index, ssd.store, grace=settings.reconcile_grace_seconds,
                    own_grace=since_start, progress=progress,
                )
        log.info("cache folder reconciled: %s", report)
    except Exception as exc:
        from omlx.domain.ports import IndexUnavailable

        if isinstance(exc, IndexUnavailable):
            log.warning("start-up reconcile skipped: %s", exc)
        else:
            log.exception("start-up reconcile of the cache folder failed")
