"""When speculative decoding pays, and how many tokens to draft: pure arithmetic.

A speculative step feeds the next token plus ``k`` drafted ones in one forward pass and
keeps the drafts the model agrees with, so a step yields ``1 + accepted`` tokens for the
price of a pass over ``k + 1`` positions. On a CPU that price grows with ``k`` (measured
on the default model at a 2k context: 8 positions cost ~2x one), so drafting blindly
makes free text slower. ``DraftPolicy`` drafts only when the expected yield beats the
expected cost:

- each row keeps an estimate of how often its drafts are accepted (``Acceptance``:
  decayed counts, so a row that starts copying a file is believed within a few steps,
  and one that stops is believed too). A proposer that costs nothing (prompt lookup)
  keeps proposing during plain steps too, and the token the model then picks says
  whether the first draft would have been kept: the estimate follows the text even
  while the row is not drafting, so drafting starts as soon as copying does;
- ``StepCosts`` keeps the measured seconds of a step by draft length (a plain step is
  length 0) and prices lengths not yet seen from a prior slope;
- with acceptance rate ``r`` a draft of ``k`` yields ``(1 - r^(k+1)) / (1 - r)`` tokens
  on average; the policy picks the ``k`` with the best yield per second and drafts
  nothing unless that beats a plain step by ``margin``.
"""

from __future__ import annotations

from dataclasses import dataclass

LOOKUP = "lookup"
DRAFT_MODEL = "draft_model"


@dataclass(frozen=True, slots=True)
class SpeculationConfig:
    """How an engine speculates (``None`` in its place: never)."""

    method: str = LOOKUP  # LOOKUP: n-grams of the prompt and output; DRAFT_MODEL: a small model
    max_draft: int = 12  # the most tokens drafted for one step
    ngram_max: int = 4  # prompt lookup matches the last ngram_max .. ngram_min tokens
    ngram_min: int = 2
    # Speculate only while at most this many rows decode: every row of a batch keeps the
    # fewest drafts any row accepted (its cache is trimmed as one), so a second row that
    # is not copying takes the gain away (docs/benchmarks.md, "Speculative decoding").
    max_rows: int = 1
    margin: float = 1.05  # draft only when the expected tokens per second beat a plain step by this
    # Prior cost of one more position in a step, relative to a plain step; replaced by
    # what the engine measures. Drafting with a model adds its own passes on top.
    position_cost: float = 0.15
    draft_token_cost: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in (LOOKUP, DRAFT_MODEL):
            raise ValueError(f"speculation method must be {LOOKUP!r} or {DRAFT_MODEL!r}")
        if self.max_draft < 1 or self.ngram_min < 1 or self.ngram_max < self.ngram_min:
            raise ValueError("max_draft >= 1 and 1 <= ngram_min <= ngram_max")
        if self.max_rows < 1:
            raise ValueError("max_rows must be >= 1")


@dataclass(slots=True)
class Acceptance:
    """One row's drafting record: decayed counts of accepted drafts and of trials.

    A trial is a drafted position the model was asked about: every accepted one, and the
    first rejected one (later drafts of that step were never compared).
    """

    accepted: float = 0.0
    trials: float = 0.0
    decay: float = 0.8  # per record: the last ~5 steps weigh most
    prior_accepted: float = 1.0
    prior_trials: float = 2.0

    @property
    def rate(self) -> float:
        return (self.accepted + self.prior_accepted) / (self.trials + self.prior_trials)

    def record(self, drafted: int, accepted: int) -> None:
        self.accepted = self.accepted * self.decay + accepted
        self.trials = self.trials * self.decay + accepted + (1 if accepted < drafted else 0)


@dataclass(slots=True)
class StepCosts:
    """What a step with drafts costs, in plain steps: ``1 + slope x drafted``.

    The slope starts at a prior and follows the measured steps, smoothed (single timings
    on a shared machine move by 2x): each speculative step's seconds against the smoothed
    seconds of plain steps.
    """

    slope: float = 0.15
    smoothing: float = 0.1
    plain_seconds: float | None = None

    def observe_plain(self, seconds: float) -> None:
        old = self.plain_seconds
        self.plain_seconds = seconds if old is None else old + self.smoothing * (seconds - old)

    def observe(self, drafted: int, seconds: float) -> None:
        """A speculative step's seconds (drafting and verifying ``drafted`` tokens)."""
        if not self.plain_seconds or drafted < 1:
            return
        measured = (seconds / self.plain_seconds - 1.0) / drafted
        # Bounded: one step slowed by a neighbour's burst must not end drafting for good.
        measured = min(max(measured, 0.01), 0.6)
        self.slope += self.smoothing * (measured - self.slope)

    def relative(self, drafted: int) -> float:
        """A step with ``drafted`` tokens, in plain steps."""
        return 1.0 + drafted * self.slope


def expected_tokens(rate: float, drafted: int) -> float:
    """Tokens a step yields on average when each draft is accepted with ``rate``."""
    if rate >= 1.0:
        return drafted + 1.0
    return (1.0 - rate ** (drafted + 1)) / (1.0 - rate)


@dataclass(slots=True)
class DraftPolicy:
    config: SpeculationConfig
    costs: StepCosts

    @classmethod
    def of(cls, config: SpeculationConfig) -> DraftPolicy:
        return cls(config, StepCosts(config.position_cost + config.draft_token_cost))

    def length(self, rate: float, available: int) -> int:
        """How many of ``available`` drafted tokens to verify (0: a plain step)."""
        best_k, best_value = 0, self.config.margin
        for k in range(1, min(available, self.config.max_draft) + 1):
            value = expected_tokens(rate, k) / self.costs.relative(k)
            if value > best_value:
                best_k, best_value = k, value
        return best_k


@dataclass(frozen=True, slots=True)
class SpeculationSummary:
    """What speculation did for one request (metrics, the debug line)."""

    method: str
    steps: int = 0  # speculative steps (verify passes with drafts)
    drafted: int = 0  # drafted tokens the model was asked about
    accepted: int = 0  # drafted tokens kept (each one a forward pass saved)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None
