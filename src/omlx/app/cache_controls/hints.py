"""The clients' own cache hints, read into pins (issue 24; ``CacheControls.honour`` pins them).

Anthropic ``cache_control`` breakpoints (``{"type": "ephemeral", "ttl": "5m" | "1h"}`` on
a tool, a system block or a message's content block, or at the top level for the whole
prompt) pin the prompt's blocks up to the end of the message holding each breakpoint
for that TTL; OpenAI ``prompt_cache_retention: "24h"`` pins the prompt for a day, with
its ``prompt_cache_key`` as the pin's group. Pins stay within the cache's pinned share:
a hint that does not fit is logged and skipped, never an error (the request is served).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from omlx.app.errors import InvalidRequest
from omlx.domain.cache.partial_match import common_prefix

ANTHROPIC_TTLS = {"5m": 300.0, "1h": 3600.0}
OPENAI_RETENTIONS = {"in_memory": None, "in-memory": None, "24h": 24 * 3600.0}
WHOLE_PROMPT = -1  # a breakpoint at the prompt's end (Anthropic's top-level cache_control)


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """Pin the prompt up to the end of template message ``message`` for ``ttl`` seconds."""

    message: int
    ttl: float


def _ttl(control: Any, param: str) -> float | None:
    if control is None:
        return None
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise InvalidRequest(f"{param} must be {{'type': 'ephemeral'}}", param=param)
    ttl = control.get("ttl", "5m")
    if ttl not in ANTHROPIC_TTLS:
        raise InvalidRequest(f"{param}.ttl must be '5m' or '1h', not {ttl!r}", param=f"{param}.ttl")
    return ANTHROPIC_TTLS[ttl]


def anthropic_breakpoints(data: Any, labels: Sequence[str]) -> list[Breakpoint]:
    """The request's ``cache_control`` breakpoints, each as the template message it ends."""
    last = {label: i for i, label in enumerate(labels)}  # a part's last template message
    found: list[Breakpoint] = []
    for k, tool in enumerate(data.tools or ()):
        if (ttl := _ttl(tool.cache_control, f"tools[{k}].cache_control")) is not None:
            found.append(Breakpoint(0, ttl))  # tools render with the first message
    if isinstance(data.system, list):
        for k, block in enumerate(data.system):
            ttl = _ttl(block.cache_control, f"system[{k}].cache_control")
            if ttl is not None and "system" in last:
                found.append(Breakpoint(last["system"], ttl))
    for k, message in enumerate(data.messages):
        if isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            ttl = _ttl(block.cache_control, f"messages[{k}].content[{j}].cache_control")
            if ttl is not None and f"messages[{k}]" in last:
                found.append(Breakpoint(last[f"messages[{k}]"], ttl))
    if (ttl := _ttl(getattr(data, "cache_control", None), "cache_control")) is not None:
        found.append(Breakpoint(WHOLE_PROMPT, ttl))
    return found


def openai_retention(retention: str | None) -> float | None:
    """Seconds to pin the prompt for ``prompt_cache_retention``; None: the default cache."""
    if retention is None:
        return None
    if retention not in OPENAI_RETENTIONS:
        raise InvalidRequest(
            f"prompt_cache_retention must be 'in_memory' or '24h', not {retention!r}",
            param="prompt_cache_retention",
        )
    return OPENAI_RETENTIONS[retention]


def breakpoint_ends(
    prompt: Sequence[int],
    points: Sequence[Breakpoint],
    prefix_tokens: Callable[[int], Sequence[int]],
) -> list[tuple[int, float]]:
    """``(token offset, ttl)`` per breakpoint: where the prompt's rendering of its message ends."""
    ends: dict[int, float] = {}
    for point in points:
        if point.message == WHOLE_PROMPT:
            end = len(prompt)
        else:
            end = common_prefix(prefix_tokens(point.message + 1), prompt)
        if end > 0:
            ends[end] = max(ends.get(end, 0.0), point.ttl)
    return sorted(ends.items())
