"""Tool calls in the families' own syntax: formats, the fallback that shows tools to a
template that renders none, and JSON as it streams."""

from __future__ import annotations

from omlx.app.chat.tool_calls.formats import (
    HERMES,
    ToolCallFormat,
    format_of_template,
    opaque_format,
)
from omlx.app.chat.tool_calls.partial_json import close_partial, value_end

__all__ = [
    "HERMES",
    "ToolCallFormat",
    "close_partial",
    "format_of_template",
    "opaque_format",
    "value_end",
]
