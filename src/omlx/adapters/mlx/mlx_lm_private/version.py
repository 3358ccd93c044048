"""The mlx-lm version this package was written for, and the one check against it.

The check is asked once per process (``allowed``), first at an engine's start: the engine
logs each of its features the answer turns off (``at_engine_start``) and hands the answer
to what it builds; the copy-free merge of a restored row, which mlx-lm calls on the cache
itself, reads the same answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import mlx_lm

log = logging.getLogger(__name__)

WRITTEN_FOR = "0.32."
_allowed: bool | None = None  # the answer, once asked


def private_access_supported() -> bool:
    """Whether the installed mlx-lm is the version this package was written for."""
    return mlx_lm.__version__.startswith(WRITTEN_FOR)


def allowed() -> bool:
    """Whether omlx uses mlx-lm's private state in this process (the check, asked once)."""
    global _allowed
    if _allowed is None:
        _allowed = private_access_supported()
    return _allowed


def at_engine_start(model_id: str, wanted: Sequence[tuple[str, str]]) -> bool:
    """Whether an engine may use mlx-lm's private state; where not, one warning per wanted
    feature it turns off: ``wanted`` is (the feature, what runs instead)."""
    if allowed():
        return True
    for feature, instead in wanted:
        log.warning(
            "%s of %s: off: omlx reads mlx-lm %sx's private state for it, this is mlx-lm %s; %s",
            feature,
            model_id,
            WRITTEN_FOR,
            mlx_lm.__version__,
            instead,
        )
    return False
