"""A name for decoded JSON objects, so a signature says what it holds.

``JsonObject`` is what ``json``/msgspec decode an object into, and what the HTTP edge
encodes back: string keys, values of any JSON type. Request and response bodies that
have a schema are msgspec Structs instead (STYLE 7); this is for the free-form parts
(chat messages, tool schemas, metadata, the dashboard's state).
"""

from __future__ import annotations

from typing import Any

JsonObject = dict[str, Any]
