"""What the app asks of an engine and what the engine reports back, engine-agnostic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omlx.domain.images import PromptImage
from omlx.domain.speculation import SpeculationSummary

if TYPE_CHECKING:
    from omlx.domain.cache.blocks import CachedPrefix


@dataclass(frozen=True, slots=True)
class Penalties:
    """Changes to the logits before sampling, as mlx-lm's processors make them.

    Over the last ``context`` tokens (prompt included): ``repetition`` divides the logits
    of tokens seen (1.0: off), ``presence`` is subtracted once from each seen token's
    logit, ``frequency`` once per occurrence (0.0: off). ``logit_bias`` adds to the
    logits of the tokens it names, at every step.
    """

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0
    context: int = 20
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def active(self) -> bool:
        return (
            self.repetition != 1.0
            or self.presence != 0.0
            or self.frequency != 0.0
            or bool(self.logit_bias)
        )


# A request's time to first token, phase by phase: the app's rendering and tokenizing,
# the wait for a batch slot, the prefix lookup, the restore of the matched blocks into a
# fresh cache, admission into the batch, the prefill of the uncached tail, and the step
# from the prefilled prompt to the first token.
PHASES = ("render", "grammar", "queue", "lookup", "restore", "admit", "prefill", "first_step")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0
    penalties: Penalties = field(default_factory=Penalties)


@dataclass(frozen=True, slots=True)
class ReasoningBudget:
    """At most ``tokens`` tokens of reasoning: then the engine writes the end marker itself.

    ``start`` and ``end`` are the model's reasoning markers as token ids; ``opened``: the
    prompt already opened the section.
    """

    tokens: int
    start: tuple[int, ...]
    end: tuple[int, ...]
    opened: bool = False


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    # Seconds the app spent turning the request into tokens (template, tokenizer), so the
    # engine's per-request breakdown covers what the client waited for.
    render_seconds: float = 0.0
    grammar_seconds: float = 0.0  # compiling (or finding) its output grammar
    # Log-probabilities to report per generated token: None: none; 0: the chosen token's;
    # k > 0: also the k most likely tokens.
    logprobs: int | None = None
    # A fresh grammar state for this request (``ports.TokenConstraint``), made off the
    # engine thread; the engine masks each step's logits with it. None: unconstrained.
    constraint: Any = field(default=None, compare=False)
    reasoning_budget: ReasoningBudget | None = None
    # False: a no-store request (``x-omlx-cache-control: no-store``): the prefix cache
    # restores what it holds but keeps nothing of this request.
    cache_store: bool = True
    # The API key's tenant (``--api-keys-file``): its blocks are keyed from its own root.
    cache_tenant: str | None = None
    # What the prefix cache's probe found of the prompt when the request was prepared (its
    # chain keys and the index's answer): the engine's lookup starts from it instead of
    # hashing the prompt and asking the index again.
    cache_probe: CachedPrefix | None = field(default=None, compare=False)
    # The session the client or its proxy named (``X-Session-ID``, ...): logged with the
    # request's summary line, never acted on.
    session: str | None = field(default=None, compare=False)
    # The prompt's images, in the order of their places in the rendered prompt (a VLM's).
    images: tuple[PromptImage, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class PrefillStarted:
    """The request left the queue; ``cached_tokens`` were restored, the rest is prefilled.

    ``restored``: what the prefix cache restored, as its lookup saw it (None without a
    prefix cache): the request's cache report is made from it, so it says what usage does.
    """

    cached_tokens: int
    prompt_tokens: int
    restored: CachedPrefix | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability, and the most likely alternatives at its step.

    The values are those the sampler saw: log-softmax of the logits after penalties and
    any grammar mask, before temperature.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    # Entries for the tokens generated since the previous delta (requests that ask only).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    # Where its time to first token went, in PHASES order (seconds; empty: no token came).
    phases: tuple[tuple[str, float], ...] = ()
    tier: str = (
        "none"  # where the cached prefix came from: "hot" (RAM), "ssd" (some from disk), "none"
    )
    speculation: SpeculationSummary | None = None  # what speculative decoding did, where it ran


@dataclass(frozen=True, slots=True)
class Failed:
    message: str


GenerationEvent = PrefillStarted | PrefillProgress | TextDelta | Finished | Failed


class StopStringMatcher:
    """Cuts streamed text at the first stop string, holding back a possible partial match."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string found, once stopped

    def feed(self, text: str) -> str:
        """Text that is safe to emit now; after a stop string nothing more is emitted."""
        if self.stopped or not text:
            return ""
        if not self._stops:
            return text
        buffer = self._held + text
        found = [(i, s) for s in self._stops if (i := buffer.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda hit: hit[0])
            self.stopped = True
            self._held = ""
            return buffer[:cut]
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held-back text once generation ended without completing a stop string."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that starts some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest
