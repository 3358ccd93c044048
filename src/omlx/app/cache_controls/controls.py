"""A turn's cache controls, read once at the edge and carried whole to the chat pipeline."""

from __future__ import annotations

from dataclasses import dataclass

from omlx.app.cache_controls.hints import Breakpoint
from omlx.app.cache_controls.session_key import SessionKey


@dataclass(frozen=True, slots=True)
class TurnControls:
    """What one request asks of the prefix cache, whichever API family it came through.

    ``tenant``: the API key's tenant (its own chain root; None: the default one).
    ``store``: False for a no-store request, which restores but keeps and pins nothing.
    ``retention``: seconds to pin the whole prompt (OpenAI ``prompt_cache_retention``).
    ``session_key``: the client's name for the conversation (``prompt_cache_key``): its
    previous turn is what a cache miss is compared with, and its pins' group.
    ``breakpoints``: Anthropic ``cache_control`` marks, each pinning a prefix.
    ``session``: the session as the client or its proxy names it (``session_key``: a
    header, ``prompt_cache_key`` or Anthropic ``metadata.user_id``), only reported.
    """

    tenant: str | None = None
    store: bool = True
    retention: float | None = None
    session_key: str | None = None
    breakpoints: tuple[Breakpoint, ...] = ()
    session: SessionKey | None = None
