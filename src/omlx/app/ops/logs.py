"""The server's log: one format with timestamps for omlx's, uvicorn's and libraries' lines,
and libraries' routine chatter (Alembic's plugin and migration lines) kept to debug."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Loggers whose INFO lines describe their own machinery, not the server: shown at debug.
_QUIET_AT_INFO = ("alembic",)


def configure_logging(level: str) -> None:
    """Route every logger through one handler and format at ``level`` (a name: "info")."""
    numeric = logging.getLevelName(level.upper())
    logging.basicConfig(level=numeric, format=LOG_FORMAT, force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_plain_uvicorn_name)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        # uvicorn's own config is off (log_config=None): its lines propagate to ours.
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    for name in _QUIET_AT_INFO:
        logging.getLogger(name).setLevel(logging.WARNING if numeric > logging.DEBUG else numeric)


def _plain_uvicorn_name(record: logging.LogRecord) -> bool:
    """uvicorn logs its start and stop lines as ``uvicorn.error``: show them as ``uvicorn``."""
    if record.name == "uvicorn.error":
        record.name = "uvicorn"
    return True
