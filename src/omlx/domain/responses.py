"""Stored Responses-API responses: the record, its retention rule and the store port.

A stored response keeps the conversation it answered whole (its resolved input items,
earlier turns included) beside the response object, so a follow-up naming it with
``previous_response_id`` costs one lookup. Items and the response object are plain
JSON-able values: the store never looks inside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    created_at: float  # epoch seconds
    response: dict[str, Any]  # the Response object as the API returned it
    input_items: list[dict[str, Any]] = field(default_factory=list)

    @property
    def output_items(self) -> list[dict[str, Any]]:
        return list(self.response.get("output") or [])


@dataclass(frozen=True, slots=True)
class Retention:
    """At most ``max_responses`` kept, none older than ``max_age_days``; pruned as rows are written."""

    max_responses: int = 1000
    max_age_days: float = 30.0

    def __post_init__(self) -> None:
        if self.max_responses < 0 or self.max_age_days <= 0:
            raise ValueError("responses_max_stored must be >= 0 and responses_max_age_days > 0")

    def cutoff(self, now: float) -> float:
        """Responses created before this time are expired."""
        return now - self.max_age_days * DAY

    def excess(self, count: int) -> int:
        """How many of ``count`` kept responses must go, oldest first."""
        return max(count - self.max_responses, 0)


class ResponseStore(Protocol):
    """Where stored responses live: the index database, or memory without an SSD tier."""

    def put(self, record: StoredResponse) -> None:
        """Keep ``record`` (replacing one with its id), then prune by the retention rule."""
        ...

    def get(self, response_id: str) -> StoredResponse | None:
        """The record, or None when it is unknown, deleted or expired."""
        ...

    def delete(self, response_id: str) -> bool:
        """Forget the record; False when there was none."""
        ...
