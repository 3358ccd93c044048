"""Which session a request belongs to, as its client or the proxy in front names it.

Proxies keep a conversation on the server that holds its KV by hashing a header (SGLang's
model gateway: ``X-SMG-Routing-Key``; replays of real Claude Code traces send
``X-Session-ID``; HAProxy and nginx hash any header). omlx takes the first of: the
``X-Session-ID`` header, the ``X-SMG-Routing-Key`` header, the body's ``prompt_cache_key``
(OpenAI), the body's ``metadata.user_id`` (Anthropic), and reports it beside where the turn's
prefix came from (the cache report, the request log), so a missed affinity shows. It is
never acted on: a turn computes the same with or without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from omlx.app.errors import InvalidRequest

SESSION_HEADER = "x-session-id"
ROUTING_HEADER = "x-smg-routing-key"
PROMPT_CACHE_KEY = "prompt_cache_key"
USER_ID = "metadata.user_id"
SOURCES = (SESSION_HEADER, ROUTING_HEADER, PROMPT_CACHE_KEY, USER_ID)  # first found wins
# A name for a conversation, not a document: bounded, so what keeps or logs them stays small.
MAX_CHARS = 512


@dataclass(frozen=True, slots=True)
class SessionKey:
    value: str
    source: str  # the one of ``SOURCES`` it came from


def choose_session_key(
    headers: Mapping[str, str],
    *,
    prompt_cache_key: str | None = None,
    metadata: object = None,
) -> SessionKey | None:
    """The request's session key from the first of ``SOURCES`` that names one (None: none).

    ``headers``: looked up by lower-case name. An empty value names nothing (a proxy that
    forwards an unset variable); a value that is not printable text of at most
    ``MAX_CHARS`` characters is refused with a 400 naming where it came from, wherever it
    stands in the order, as every other malformed field is.
    """
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    found = (
        (SESSION_HEADER, headers.get(SESSION_HEADER)),
        (ROUTING_HEADER, headers.get(ROUTING_HEADER)),
        (PROMPT_CACHE_KEY, prompt_cache_key),
        (USER_ID, user_id),
    )
    chosen = None
    for source, value in found:
        if value is None:
            continue
        _check(source, value)
        if chosen is None and value:
            chosen = SessionKey(value, source)
    return chosen


def _check(source: str, value: object) -> None:
    if not isinstance(value, str):
        raise InvalidRequest(f"{source} must be a string", param=source)
    if len(value) > MAX_CHARS:
        raise InvalidRequest(
            f"{source} is {len(value)} characters; at most {MAX_CHARS} are accepted",
            param=source,
        )
    if not value.isprintable():
        raise InvalidRequest(
            f"{source} holds a control character; a session key is printable text",
            param=source,
        )
