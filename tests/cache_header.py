"""The ``x-omlx-cache`` header read back, and its one invariant: ``cached`` is usage's.

Every test that reads the header checks it through ``checked_header``: the report is made
from the engine's own restore, so on every path (RAM, disk, a partial block, a restart,
a hybrid's restore point, a kept cache, a wait for another request's prefill) the tokens
it says were cached are the tokens usage says were restored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HEADER = "x-omlx-cache"


def header_fields(value: str) -> dict[str, str]:
    """``cached=N; tier=T; ...`` as a dict."""
    return dict(part.split("=", 1) for part in value.split("; "))


def usage_cached(body: Mapping[str, Any]) -> int:
    """The restored prompt tokens a response's usage reports, whichever API answered."""
    usage = body["usage"]
    if "cache_read_input_tokens" in usage:  # Anthropic
        return usage["cache_read_input_tokens"]
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return details.get("cached_tokens", 0)


def checked_header(headers: Mapping[str, str], cached: int) -> dict[str, str]:
    """The response's ``x-omlx-cache`` fields, once its ``cached`` is found equal to
    ``cached`` (usage's restored tokens)."""
    fields = header_fields(headers[HEADER])
    assert int(fields["cached"]) == cached, (
        f"{HEADER}: {headers[HEADER]!r}, but usage says {cached} cached"
    )
    return fields


def checked(response: Any) -> dict[str, str]:
    """A whole (non-streamed) response's header fields, checked against its body's usage
    (an ``httpx`` response, or an SDK's ``with_raw_response`` one)."""
    response = getattr(response, "http_response", response)  # an SDK's raw response
    return checked_header(response.headers, usage_cached(response.json()))
