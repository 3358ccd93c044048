"""Run the HTTP server: bind the port, bootstrap, then uvicorn on the Litestar app until a
signal stops it (``stopping_server``)."""

from __future__ import annotations

import errno
import gc
import logging
import signal
import socket
from typing import TYPE_CHECKING

from omlx.app.early_port import EarlyPort
from omlx.app.settings import Settings
from omlx.domain.startup import STARTUP

if TYPE_CHECKING:  # imported while the port already answers (``_prepare``)
    from omlx.app.stopping_server import StoppingServer
    from omlx.app.wiring.container import Container

log = logging.getLogger(__name__)


class PortUnavailable(RuntimeError):
    """The address to listen on cannot be bound: said before anything is loaded."""


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn listens on it later); PortUnavailable,
    naming the port and the flag that changes it, when another program holds it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise PortUnavailable(
            f"cannot listen on host {host!r} ({exc.strerror}): choose another with --host"
        ) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
    )  # as uvicorn: restarts rebind at once
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortUnavailable(
                f"port {port} on {host} is already in use (another omlx, or another program): "
                "stop it or choose another port with --port"
            ) from None
        if exc.errno == errno.EACCES:
            raise PortUnavailable(
                f"port {port} on {host} needs privileges to bind: choose one above 1023 with --port"
            ) from None
        raise PortUnavailable(
            f"cannot listen on {host}:{port} ({exc.strerror}): check --host and --port"
        ) from None
    return sock


def run_server(settings: Settings) -> None:
    # The port first: a port in use is one line before seconds of loading, not after. It
    # answers /health at once and holds other requests until the app takes them (early_port).
    listener = bind_listener(settings.host, settings.port)
    early = EarlyPort(listener, STARTUP.waiting_for).start()
    starting = STARTUP.begin("starting the HTTP server")  # until the app takes the port
    # Until the server's loop takes the signals (StoppingServer), SIGTERM stops the start as
    # Ctrl-C does: everything opened is closed, and the process exits 0.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        container, server = _prepare(settings)
    except BaseException as exc:
        STARTUP.end(starting)
        early.hand_over(listener.getsockname())
        listener.close()
        if isinstance(exc, KeyboardInterrupt):
            log.info("stopped while starting")
            return
        raise
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    log.info("serving %s on http://%s:%d", ", ".join(container.pool.specs), host, settings.port)
    STARTUP.end(starting)
    early.hand_over(listener.getsockname())
    try:
        server.run(sockets=[listener])
    finally:
        listener.close()
        container.close()
        # Garbage still holding MLX arrays (the frames of tasks cancelled at the stop, which
        # held an unloaded model) is freed now, on this thread: collected by another thread
        # while the interpreter exits, it aborted the process ("terminate called without an
        # active exception"), about one stop in ten here.
        gc.collect()


def _prepare(settings: Settings) -> tuple[Container, StoppingServer]:
    """The container and the server over its app, ready to take the listener."""
    with STARTUP.step("importing the HTTP app"):
        import uvicorn

        from omlx.app.api.app import create_app
        from omlx.app.cache_controls.tenants import load_keys
        from omlx.app.stopping_server import StoppingServer
        from omlx.app.wiring.bootstrap import bootstrap

    # The keys before the cache: a mistaken keys file stops the start, touching nothing.
    keys = load_keys(settings.api_keys_file, settings.api_key) if settings.api_keys_file else None
    with STARTUP.step("opening the cache"):
        container = bootstrap(settings, load_in_background=True)
    try:
        config = uvicorn.Config(
            create_app(container, keys),
            log_config=None,  # uvicorn's lines go through omlx's own format (omlx.app.ops.logs)
            log_level=settings.log_level,
            # What the stop does not end itself (a cache export's download) gets this long.
            timeout_graceful_shutdown=5,
        )
        return container, StoppingServer(config, container.stop)
    except BaseException:
        container.close()
        raise


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
