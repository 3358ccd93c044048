"""Stored Responses-API responses: the record, its retention rule and the store port.

A conversation continued with ``previous_response_id`` is stored as links: each record
keeps only the input items its own request added and the id of the response it
continued, so a chain of n turns costs n turns of storage, not n²/2. ``history`` joins
a chain back into the conversation. Removing a record (pruned, expired, deleted) folds
its items into the records that continued it, so every kept record stays whole.
Items and the response object are plain JSON-able values: the store never looks inside.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    created_at: float  # epoch seconds
    response: dict[str, Any]  # the Response object as the API returned it
    input_items: list[dict[str, Any]] = field(default_factory=list)  # this turn's own
    previous_id: str | None = None  # the stored response this one continued
    tenant: str = ""  # the API key's tenant that created it ("": the default one)

    @property
    def output_items(self) -> list[dict[str, Any]]:
        return list(self.response.get("output") or [])

    @property
    def nbytes(self) -> int:
        """What the record costs to keep: its JSON's bytes."""
        return len(json.dumps([self.response, self.input_items], separators=(",", ":")).encode())


def history(chain: Sequence[StoredResponse]) -> list[dict[str, Any]]:
    """The conversation a follow-up of ``chain[-1]`` continues: every turn's input and output."""
    items: list[dict[str, Any]] = []
    for record in chain:
        items += [*record.input_items, *record.output_items]
    return items


def conversation_input(chain: Sequence[StoredResponse]) -> list[dict[str, Any]]:
    """The whole input ``chain[-1]`` answered: earlier turns, then its own items."""
    return [*history(chain[:-1]), *chain[-1].input_items] if chain else []


def folded(removed: StoredResponse, child: StoredResponse) -> StoredResponse:
    """``child`` once ``removed``, the record it continued, is gone: it carries its items."""
    items = [*removed.input_items, *removed.output_items, *child.input_items]
    return replace(child, input_items=items, previous_id=removed.previous_id)


class BrokenChain(Exception):
    """A stored response's chain reaches a record that is not there (a store bug or a race)."""


@dataclass(frozen=True, slots=True)
class Retention:
    """At most ``max_responses`` kept, none older than ``max_age_days``, at most
    ``max_bytes`` in all (0: no byte bound); pruned as rows are written, oldest first."""

    max_responses: int = 1000
    max_age_days: float = 30.0
    max_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if self.max_responses < 0 or self.max_age_days <= 0 or self.max_bytes < 0:
            raise ValueError(
                "responses_max_stored and responses_max_bytes must be >= 0 and "
                "responses_max_age_days > 0"
            )

    def cutoff(self, now: float) -> float:
        """Responses created before this time are expired."""
        return now - self.max_age_days * DAY

    def excess(self, count: int) -> int:
        """How many of ``count`` kept responses must go, oldest first."""
        return max(count - self.max_responses, 0)

    def over_bytes(self, total: int) -> int:
        """How many bytes of ``total`` must go (0 when within the budget or there is none)."""
        return max(total - self.max_bytes, 0) if self.max_bytes else 0

    def fits(self, nbytes: int) -> bool:
        """Whether one record of ``nbytes`` can be kept at all."""
        return not self.max_bytes or nbytes <= self.max_bytes


class TooLargeToStore(Exception):
    """One response is larger than the whole byte budget of the store."""


@runtime_checkable  # handlers receive one through litestar, which checks its type
class ResponseStore(Protocol):
    """Where stored responses live: the index database, or memory without an SSD tier.

    Any method may raise ``cache.ports.IndexUnavailable`` when the database cannot be used.
    """

    def put(self, record: StoredResponse) -> None:
        """Keep ``record`` (replacing one with its id), then prune by the retention rule;
        ``TooLargeToStore`` when it alone exceeds the byte budget."""
        ...

    def get(self, response_id: str) -> StoredResponse | None:
        """The record, or None when it is unknown, deleted or expired."""
        ...

    def chain(self, response_id: str) -> list[StoredResponse] | None:
        """The record and those it continued, oldest first; None when it is not stored."""
        ...

    def delete(self, response_id: str) -> bool:
        """Forget the record (its followers keep its items); False when there was none."""
        ...


class TenantResponses:
    """One tenant's view of a ``ResponseStore``: what it puts is stamped with its name, and
    another tenant's responses are not there for it (read, continued, listed or deleted),
    exactly as an unknown id is not."""

    def __init__(self, store: ResponseStore, tenant: str | None) -> None:
        self._store, self.tenant = store, tenant or ""

    def put(self, record: StoredResponse) -> None:
        self._store.put(replace(record, tenant=self.tenant))

    def get(self, response_id: str) -> StoredResponse | None:
        record = self._store.get(response_id)
        return record if record is not None and record.tenant == self.tenant else None

    def chain(self, response_id: str) -> list[StoredResponse] | None:
        chain = self._store.chain(response_id)
        return chain if chain and chain[-1].tenant == self.tenant else None

    def delete(self, response_id: str) -> bool:
        return self.get(response_id) is not None and self._store.delete(response_id)
