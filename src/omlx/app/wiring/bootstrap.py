"""The composition root (STYLE §3): the one place that builds adapters and wires them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omlx.adapters.mlx.models.blas import describe_blas, load_optimized_blas, log_blas
from omlx.app.cache_controls.maintenance import CacheMaintenance
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.observers import Observers
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.models.catalog import CHAT, ModelSpec, catalog
from omlx.app.models.model_names import ModelNames
from omlx.app.models.pool import ModelPool
from omlx.app.settings import Settings
from omlx.app.stop_signal import StopSignal
from omlx.app.wiring.container import Container
from omlx.app.wiring.model_loader import ModelLoader, SharedCold, serve_chat
from omlx.app.wiring.responses_store import MemoryResponseStore, ResponseStore
from omlx.app.wiring.startup_errors import check_cache_folder, index_error
from omlx.domain.memory import MemoryAccount
from omlx.domain.ports import ChatModel, GenerationEngine, GrammarCompiler

if TYPE_CHECKING:  # imported where they are opened: a test's bootstrap opens neither
    from omlx.adapters.cold_folder import ColdFolder
    from omlx.adapters.sqlindex import SqlBlockIndex
    from omlx.domain.cache.prefix_cache import PrefixCache

log = logging.getLogger(__name__)

# How long after the stop begins a block cut from a running generation waits for room in
# the writer's queue (on the engine thread: no request is left to wait). Under the
# engines' own 10 s to stop; the writer then drains for up to 30 s as ever.
STOP_WRITES_WAIT_S = 8.0


def bootstrap(
    settings: Settings,
    *,
    load_in_background: bool = False,
    model: ChatModel | None = None,
    engine: GenerationEngine | None = None,
    grammars: GrammarCompiler | None = None,
    prefix_cache: PrefixCache | None = None,
) -> Container:
    """Find the models, open the shared cache tiers, load the models asked for at start.

    ``load_in_background``: only check that those models fit, and leave their loads to
    the app once it listens (``Container.start_loads``), so the port opens in about the
    time the imports take.

    ``model`` with ``engine`` (tests): serve that one loaded model through that engine,
    with ``grammars`` for constrained output, instead of finding and loading models. The
    services are wired as for a loaded model (``serve_chat``); nothing of MLX is imported
    and no cache tier is opened (an engine brings its own cache, or none).
    """
    if (model is None) != (engine is None):
        raise ValueError("bootstrap: model= and engine= go together")
    if engine is None:
        load_optimized_blas()  # before the first import of mlx below
        log_blas()
    closers: list = []
    try:
        if model is not None:
            specs = [ModelSpec(model.model_id, None)]
        else:
            specs = catalog(list(settings.model_list), settings.model_dir)
        chat_ids = [s.id for s in specs if s.task == CHAT]
        names = ModelNames(
            [s.id for s in specs],
            settings.model_aliases,
            settings.answer_any_model,
            default=chat_ids[0] if chat_ids else None,
        )
        observers = Observers()  # the app's metrics and request log subscribe to it
        stop = StopSignal()  # requested by the first SIGINT or SIGTERM (server.py)
        if model is not None and engine is not None:
            pool = ModelPool(specs, names, stop=stop)
            served = serve_chat(
                settings,
                specs[0],
                model,
                engine,
                grammars=grammars,
                prefix_cache=prefix_cache,
                observers=observers,
                stop=stop,
            )
            pool.add(served)
            return _container(settings, pool, None, None, closers, [], observers, blas="")
        from omlx.adapters.mlx.cache.memory import (
            keep_freed_buffers,
            return_freed_memory,
            total_ram_bytes,
        )

        account = MemoryAccount(settings.max_model_memory_bytes(total_ram_bytes()))
        pool_bytes = keep_freed_buffers(_kv_memory_limit(settings))
        log.debug("MLX keeps up to %d bytes of freed buffers for reuse", pool_bytes)
        ssd = (
            _open_ssd(settings, closers)
            if settings.cache_enabled and settings.ssd_cache_enabled
            else None
        )
        pool_ref: list[ModelPool] = []  # the writer asks the pool, built just below, about pins
        cold = (
            _start_shared_cold(settings, ssd, lambda key: pool_ref[0].is_pinned(key), closers)
            if ssd
            else None
        )
        if cold is not None:  # what the stop cuts is written, not dropped for a full queue
            stop.subscribe(partial(cold.writer.wait_for_room, STOP_WRITES_WAIT_S))
        loader = ModelLoader(
            settings,
            cold,
            account,
            _kv_memory_limit(settings),
            digest_cache=_digest_cache(ssd.index) if ssd else None,
            observers=observers,
            stop=stop,
        )
        pool = ModelPool(
            specs,
            names,
            load=loader.load,
            estimate=loader.estimate,
            account=account,
            pinned=settings.pin_models,
            idle_timeout=settings.model_idle_timeout or None,
            release_memory=return_freed_memory,
            stop=stop,
        )
        pool_ref.append(pool)
        closers.append(pool.close)  # after the engines stop, the writer drains (closers reversed)
        start_loads = []
        for spec in specs:
            if spec.id in pool.pinned or settings.model_list or len(specs) == 1:
                if load_in_background:
                    pool.check_fits(spec)
                    start_loads.append(spec)
                else:
                    pool.preload(spec)
        return _container(
            settings, pool, ssd, cold, closers, start_loads, observers, blas=describe_blas()
        )
    except BaseException:
        _close_all(closers)
        raise


def _container(
    settings: Settings,
    pool: ModelPool,
    ssd: ColdFolder | None,
    cold: SharedCold | None,
    closers: list,
    start_loads: list[ModelSpec],
    observers: Observers,
    *,
    blas: str,
) -> Container:
    maintenance = None
    if ssd is not None:
        maintenance = CacheMaintenance(
            ssd,
            max_bytes=settings.ssd_cache_bytes,
            lease=settings.eviction_lease_seconds,
            is_pinned=pool.is_pinned,
            loaded=lambda: {s.id: s.controls for s in pool.loaded() if s.controls is not None},
            queued=lambda: cold.writer.stats().queued if cold is not None else 0,
        )
    return Container(
        settings=settings,
        pool=pool,
        stop=pool.stop,
        names=pool.names,
        normalizer=PromptNormalizer(settings.prompt_normalizations),
        seal=ReasoningSeal.for_folder(settings.cache_dir if ssd is not None else None),
        responses=_response_store(settings, ssd),
        started_at=int(time.time()),
        blas=blas,
        writer=cold.writer if cold is not None else None,
        ssd=ssd,
        maintenance=maintenance,
        observers=observers,
        closers=closers,
        start_loads=start_loads,
    )


def _response_store(settings: Settings, ssd: ColdFolder | None) -> ResponseStore:
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
    from omlx.adapters.mlx.cache.memory import auto_limit_bytes

    limit = settings.kv_memory_limit_bytes
    return auto_limit_bytes() if limit is None else limit


def _close_all(closers: list) -> None:
    while closers:
        try:
            closers.pop()()
        except Exception:
            log.exception("error while closing")


def _open_ssd(settings: Settings, closers: list) -> ColdFolder:
    """Lock the cache folder (exclusive, or shared with a shared index) and open its index."""
    from sqlalchemy import exc as sa_exc

    from omlx.adapters.blockfiles import CacheDirLocked
    from omlx.adapters.cold_folder import index_url_of, is_shared, open_cold_folder
    from omlx.adapters.sqlindex import display

    cache_dir = settings.cache_dir
    check_cache_folder(cache_dir)  # a path under a file, read-only, not ours: one line
    url = index_url_of(cache_dir, settings.index_url or None)
    server_id = settings.server_identity
    try:
        ssd = open_cold_folder(
            cache_dir,
            settings.index_url or None,
            writer_id=server_id,
            block_store=settings.block_store,
            read_through_bytes=settings.read_through_bytes,
        )
    except CacheDirLocked as exc:  # with the other server's pid
        if not is_shared(url):
            raise
        raise RuntimeError(
            f"cache folder {cache_dir} is owned by a server with an embedded index "
            f"(pid {exc.pid or '?'}); servers share a folder only through one --index-url"
        ) from None
    except sa_exc.OperationalError as exc:
        if not is_shared(url):
            raise index_error(display(url), exc) from None
        raise _unreachable(url, exc) from None
    except sa_exc.DatabaseError as exc:  # damaged past what open_cold_folder sets aside
        raise index_error(display(url), exc) from None
    closers.append(ssd.close)  # its read threads, the index, the lock: after the writer
    if ssd.block_store:
        _check_object_store(ssd)
    if ssd.shared:
        from omlx.adapters.sqlindex.postgres import hold_identity

        try:
            closers.append(hold_identity(ssd.index.engine, server_id).close)
        except sa_exc.OperationalError as exc:
            raise _unreachable(url, exc) from None
        log.info("shared index %s, as server %s", display(url), server_id)
    return ssd


def _check_object_store(ssd: ColdFolder) -> None:
    """One request to the bucket at start: refused (keys, bucket) stops the start with one
    line; no answer is one warning, and the server computes what it cannot fetch."""
    from omlx.adapters.objectstore import StoreDenied, StoreUnreachable

    check = getattr(ssd.store, "check", None)
    if check is None:
        return
    try:
        check()
    except StoreDenied as exc:
        raise RuntimeError(f"object store refused: {exc}") from None
    except StoreUnreachable as exc:
        log.warning(
            "object store %s does not answer (%s); serving anyway: blocks are computed "
            "until it does",
            ssd.block_store,
            exc,
        )
        return
    log.info("blocks in object store %s, read through copies in %s", ssd.block_store, ssd.dir)


def _unreachable(url: str, exc: Any) -> RuntimeError:
    """One line for a database that cannot be reached, naming the index (its password hidden)."""
    from omlx.adapters.sqlindex import display

    first = str(exc.orig or exc).strip().splitlines()[0]
    return RuntimeError(f"cannot reach the index {display(url)}: {first}")


def _digest_cache(index: SqlBlockIndex) -> Callable[[Path, Callable[[Path], str]], str]:
    """Remember weight digests per (path, size, mtime): hashing large weights is slow."""

    def cached(path: Path, compute: Callable[[Path], str]) -> str:
        stat = path.stat()
        key = str(path.resolve())
        digest = index.weight_digest_lookup(key, stat.st_size, stat.st_mtime)
        if digest is None:
            digest = compute(path)
            index.weight_digest_store(key, stat.st_size, stat.st_mtime, digest)
        return digest

    return cached


def _start_shared_cold(
    settings: Settings, ssd: ColdFolder, is_pinned: Callable[[str], bool], closers: list
) -> SharedCold:
    """The writer, recency and start-up reconcile every model's cold tier shares."""
    from omlx.adapters.cold_folder import start_cold_writer

    cold = start_cold_writer(
        ssd, settings.ssd_cache_bytes, is_pinned=is_pinned, lease=settings.eviction_lease_seconds
    )
    # Closed in reverse: drain the writer, then flush recency so LRU order survives.
    closers.append(cold.close)
    # Start-up reads the index, not the folder; the reconcile of what a crash left
    # runs beside serving.
    started = time.time()
    threading.Thread(
        target=_reconcile_quietly, args=(settings, ssd, started), name="omlx-reconcile", daemon=True
    ).start()
    return SharedCold(ssd, cold.writer, cold.recency)


def _reconcile_quietly(settings: Settings, ssd: ColdFolder, started: float) -> None:
    """Own folder: every file older than this start is stale (our writer's are younger).

    Shared folder: one server at a time, sparing what is younger than the grace period
    (a peer's write in flight, a file the share does not show us yet), except our own
    temporary files from before this start: no one else writes under our identity.

    An object store's objects are dated by the store's clock, not ours: they get the
    grace period even in a folder we own, so a PUT whose row is being added is spared.
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
            grace = since_start
            if ssd.block_store:
                grace = max(grace, settings.reconcile_grace_seconds)
            report = reconcile(ssd.index, ssd.store, grace=grace, progress=progress)
        else:
            with ssd.index.maintenance_lock() as ours:
                if not ours:
                    log.info("another server is reconciling the shared cache folder; skipped")
                    return
                report = reconcile(
                    ssd.index,
                    ssd.store,
                    grace=settings.reconcile_grace_seconds,
                    own_grace=since_start,
                    progress=progress,
                )
        log.info("cache folder reconciled: %s", report)
    except Exception as exc:
        from omlx.domain.cache.ports import IndexUnavailable

        if isinstance(exc, IndexUnavailable) or getattr(exc, "fault", None):
            # The index or the object store did not answer: said once, no traceback.
            log.warning("start-up reconcile skipped: %s", exc)
        else:
            log.exception("start-up reconcile of the cache folder failed")
