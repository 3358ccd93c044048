"""One request's life on the engine thread: what it is, its text as tokens come, when each
phase ended, its last event and its log line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omlx.adapters.mlx.batch.processors import token_logprob
from omlx.domain.generation import (
    PHASES,
    Finished,
    GenerationEvent,
    GenerationRequest,
    StopStringMatcher,
    TextDelta,
    TokenLogprob,
)
from omlx.domain.speculation import SpeculationSummary

if TYPE_CHECKING:
    from omlx.domain.cache.session import CacheSession

log = logging.getLogger("omlx.adapters.mlx.batch.engine")  # the engine's own lines

Emit = Callable[[GenerationEvent], None]


@dataclass(slots=True)
class Job:
    """One request's life on the engine thread."""

    id: int
    request: GenerationRequest
    emit: Emit
    submitted: float
    uid: int | None = None
    session: CacheSession | None = None  # its face of the prefix cache, from its lookup on
    detok: Any = None
    stops: StopStringMatcher | None = None
    cached_tokens: int = 0
    completion_tokens: int = 0
    fed_tokens: int = 0  # generated tokens fed back to the model (the cache holds them)
    prefilled: int = 0  # prompt positions in its cache so far (restored or computed)
    kept: int = 0  # prompt positions whose blocks it has handed to the prefix cache
    keys: tuple[str, ...] | None = None  # its prompt's chain keys, once a follower asked
    # A fused final chunk's blocks, kept once its first token is out (position), so the
    # cut is not on the time to first token.
    deferred_capture: int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent with a delta
    done: bool = False
    waited_epoch: int = -1  # the batch state in which it last had to wait for memory
    times: dict[str, float] = field(default_factory=dict)  # time.monotonic() marks

    @property
    def length(self) -> int:
        """Cache positions it may reach: its prompt plus every token it may generate."""
        return len(self.request.prompt_tokens) + self.request.max_tokens


def hand_out(job: Job, token: int, logprobs: Any) -> None:
    """A generated token (not EOS) to the client: its text through the stop strings, and its
    log-probability where the request asked for them."""
    job.completion_tokens += 1
    if job.request.logprobs is not None:
        job.logprobs.append(token_logprob(token, logprobs, job.request.logprobs))
    job.detok.add_token(token)
    text = job.stops.feed(job.detok.last_segment)
    if text:
        emit_text(job, text)


def flush(job: Job) -> None:
    """At the request's end: the text the detokenizer and the stop strings held back."""
    job.detok.finalize()
    tail = job.stops.feed(job.detok.last_segment) + job.stops.flush()
    if tail or job.logprobs:
        emit_text(job, tail)


def emit_text(job: Job, text: str) -> None:
    """A text delta, with the log-probabilities of the tokens since the previous one."""
    job.emit(TextDelta(text, tuple(job.logprobs)))
    job.logprobs.clear()


def finished_event(job: Job, reason: str, speculated: SpeculationSummary | None) -> Finished:
    """The request's last event: why it ended, its counts, its phases and cache tier."""
    return Finished(
        reason,
        len(job.request.prompt_tokens),
        job.completion_tokens,
        job.cached_tokens,
        job.stops.matched if job.stops is not None else None,
        phases_of(job),
        tier_of(job),
        speculated,
    )


def log_finished(
    job: Job, reason: str, model_id: str, speculated: SpeculationSummary | None = None
) -> None:
    """Its time to first token by phase and what speculation did (debug level), then its
    summary line, which names the model: request numbers are process-wide, shared by every
    model's engine."""
    if log.isEnabledFor(logging.DEBUG):
        phases = phases_of(job)
        if phases:
            log.debug(
                "request %d (%s) time to first token: %s",
                job.id,
                model_id,
                ", ".join(f"{name} {seconds * 1000:.1f} ms" for name, seconds in phases),
            )
        if speculated is not None:
            log.debug("request %d (%s) speculation: %s", job.id, model_id, describe(speculated))
    _log_summary(job, reason, model_id)


def describe(s: SpeculationSummary) -> str:
    """``lookup: 12 verify steps, 61 of 80 drafted tokens accepted (76%)``."""
    if not s.drafted:
        return f"{s.method}: nothing drafted"
    return (
        f"{s.method}: {s.steps} verify steps, {s.accepted} of {s.drafted} drafted tokens "
        f"accepted ({100 * s.accepted / s.drafted:.0f}%)"
    )


def _log_summary(job: Job, reason: str, model_id: str) -> None:
    """One line per request: what it cost, what the cache saved, how long it waited, and the
    session it named (``X-Session-ID``, ...: which conversation a proxy routed here)."""
    t = job.times
    first = t.get("first_token")
    ttft = f"{first - job.submitted:.3f} s" if first is not None else "-"
    waited = f"{t['admitted'] - job.submitted:.3f} s" if "admitted" in t else "-"
    lost = job.session.lost_tokens if job.session is not None else 0
    kept = job.session is not None and job.session.continued and job.cached_tokens
    prompt = len(job.request.prompt_tokens)
    cut_short = first is None and job.prefilled < prompt - 1
    session = job.request.session
    log.info(
        "request %d (%s) %s: prompt %d tokens, %d cached%s%s, %d generated; queued %s, first token %s%s%s",
        job.id,
        model_id,
        reason,
        prompt,
        job.cached_tokens,
        " (a kept cache)" if kept else "",
        f" ({lost} matched past the deepest restore point)" if lost else "",
        job.completion_tokens,
        waited,
        ttft,
        f"; prefill stopped at {job.prefilled} tokens" if cut_short and "admitted" in t else "",
        f"; session {session!r}" if session else "",
    )


def tier_of(job: Job) -> str:
    """Where its restored prefix came from: "ssd" (some blocks read from disk, a partial
    one included), "hot" (RAM), "none"."""
    if not job.cached_tokens or job.session is None:
        return "none"
    hit = job.session.hit
    return "ssd" if hit.cold_hits or hit.partial_from_disk else "hot"


def phases_of(job: Job) -> tuple[tuple[str, float], ...]:
    """Its time to first token by phase (``PHASES``); empty when no token came.

    The marks are taken on the engine thread: ``considered`` when the scheduler first
    looked at it, ``admitted`` after lookup and restore, ``inserted`` once in the
    batcher, ``prefilled`` at the step that finished its prompt, ``first_token``.
    """
    t = job.times
    if "first_token" not in t or "inserted" not in t:
        return ()
    spent = job.session.seconds if job.session is not None else {}
    lookup, restore = spent.get("lookup", 0.0), spent.get("restore", 0.0)
    prefilled = t.get("prefilled", t["first_token"])
    spans = {
        "render": job.request.render_seconds,
        "grammar": job.request.grammar_seconds,
        "queue": max(t["admitted"] - job.submitted - lookup - restore, 0.0),
        "lookup": lookup,
        "restore": restore,
        "admit": t["inserted"] - t["admitted"],
        "prefill": max(prefilled - t["inserted"], 0.0),
        "first_step": max(t["first_token"] - prefilled, 0.0),
    }
    return tuple((name, spans[name]) for name in PHASES)
