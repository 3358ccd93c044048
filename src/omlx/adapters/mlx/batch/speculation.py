"""An engine's speculation: its proposer of drafts, its policy, and a record per request.

The engine enables a request when it joins the batch and pops its summary when it ends;
the speculative decode steps (``speculative.SpeculativeSteps``) read and update the
records between. ``prompt_lookup.PromptLookup`` and ``models.draft_model.DraftModel``
propose the drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from omlx.domain.speculation import (
    Acceptance,
    DraftPolicy,
    SpeculationConfig,
    SpeculationSummary,
)


class Proposer(Protocol):
    """Makes drafts for a row (``prompt_lookup.PromptLookup``, ``draft_model.DraftModel``)."""

    method: str
    # Whether proposing costs nothing next to a decode step: such a proposer is asked at
    # plain steps too, to see whether its drafts would have been kept.
    free: bool

    def propose(
        self,
        uid: int,
        tokens: Sequence[int],
        pending: int | None,
        limit: int,
        choose: Callable[[int], int],
    ) -> list[int]:
        """Drafts to follow ``pending`` after ``tokens`` (the row's cached tokens): ``choose``
        is told how many are on offer (at most ``limit``) and says how many to make. A
        free proposer is also asked with ``pending`` None: drafts to follow ``tokens``."""
        ...

    def forget(self, uid: int) -> None: ...


@dataclass(slots=True)
class RowRecord:
    """What speculation did for one request, and what the policy reads of it."""

    acceptance: Acceptance = field(default_factory=Acceptance)
    # A free proposer's guess at a plain step, not verified: (the index the token will
    # have in the row's tokens, the token). The model's own token there, once it is out,
    # says whether the draft would have been kept.
    guess: tuple[int, int] | None = None
    steps: int = 0
    drafted: int = 0
    accepted: int = 0


class Speculation:
    """An engine's speculation: its proposer, policy and per-request records."""

    def __init__(self, config: SpeculationConfig, proposer: Proposer) -> None:
        self.config = config
        self.proposer = proposer
        self.policy = DraftPolicy.of(config)
        self._rows: dict[int, RowRecord] = {}  # uid -> record, from admission to ``pop``

    def enable(self, uid: int) -> None:
        """Let the request with batcher uid ``uid`` speculate."""
        self._rows[uid] = RowRecord()

    def row(self, uid: int) -> RowRecord | None:
        return self._rows.get(uid)

    def left_batch(self, uid: int) -> None:
        """The row stopped decoding: its proposer state goes (its record stays for ``pop``)."""
        self.proposer.forget(uid)

    def pop(self, uid: int | None) -> SpeculationSummary | None:
        """The request's summary, once; None when it could not speculate."""
        if uid is None:
            return None
        self.proposer.forget(uid)
        row = self._rows.pop(uid, None)
        if row is None:
            return None
        return SpeculationSummary(self.proposer.method, row.steps, row.drafted, row.accepted)

    def clear(self) -> None:
        for uid in list(self._rows):
            self.proposer.forget(uid)
        self._rows.clear()
