"""Traces in the kv-cache-tester format: reading them, tokens per hash id, a perfect prefix cache.

A trace records one agent conversation as its requests' sizes and, per request, the ids of
its full ``block_size``-token blocks (equal ids: equal content at that place, so the ids
say which prefix a request shares with the ones before it). Sub-agents are nested request
lists; consecutive sub-agent markers were started together and the parent waited for them.
The last ``in % block_size`` tokens of a request are in no block: content no later request
is known to share.

Standard library only: ``trace_replay`` imports it and the unit tests check it without a server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One recorded model call: when, how big, which blocks, what came back."""

    t: float  # seconds from the start of its conversation (or sub-agent)
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    streaming: bool = True
    input_types: tuple[str, ...] = ()
    stop: str = ""

    def tail(self, block_size: int) -> int:
        """Tokens past the last full block (never shared as far as the trace knows)."""
        return max(self.input_tokens - len(self.hash_ids) * block_size, 0)


@dataclass(frozen=True, slots=True)
class SubAgent:
    """A sub-agent's own conversation, started at ``t`` of its parent's timeline."""

    agent_id: str
    kind: str
    t: float
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class SubAgentGroup:
    """Sub-agents started together; the parent's next request waits for all of them."""

    agents: tuple[SubAgent, ...]


Step = TraceRequest | SubAgentGroup


@dataclass(frozen=True, slots=True)
class Trace:
    id: str
    block_size: int
    steps: tuple[Step, ...]
    tool_tokens: int = 0
    system_tokens: int = 0
    models: tuple[str, ...] = ()
    source: str = ""


def _request(raw: dict[str, Any]) -> TraceRequest:
    return TraceRequest(
        t=float(raw.get("t", 0.0)),
        input_tokens=int(raw["in"]),
        output_tokens=int(raw.get("out", 0)),
        hash_ids=tuple(int(h) for h in raw.get("hash_ids", ())),
        streaming=raw.get("type", "s") != "n",
        input_types=tuple(raw.get("input_types", ())),
        stop=str(raw.get("stop", "")),
    )


def _steps(raws: Sequence[dict[str, Any]], where: str) -> tuple[Step, ...]:
    steps: list[Step] = []
    group: list[SubAgent] = []
    for i, raw in enumerate(raws):
        if raw.get("type") == "subagent":
            agent_id = str(raw.get("agent_id", f"agent{i}"))
            inner = _steps(raw.get("requests", ()), f"{where}/{agent_id}")
            if inner:  # a sub-agent that failed before its first call sends nothing
                group.append(SubAgent(agent_id, str(raw.get("subagent_type", "")), raw["t"], inner))
            continue
        if group:
            steps.append(SubAgentGroup(tuple(group)))
            group = []
        if "in" not in raw:
            raise ValueError(f"{where}: request {i} has no 'in' (input tokens)")
        steps.append(_request(raw))
    if group:
        steps.append(SubAgentGroup(tuple(group)))
    return tuple(steps)


def parse_trace(data: dict[str, Any], source: str = "") -> Trace:
    """A trace from the format's JSON object (fields it does not use are ignored)."""
    trace_id = str(data.get("id") or Path(source).stem or "trace")
    return Trace(
        id=trace_id,
        block_size=int(data.get("block_size", 64)),
        steps=_steps(data.get("requests", ()), trace_id),
        tool_tokens=int(data.get("tool_tokens", 0)),
        system_tokens=int(data.get("system_tokens", 0)),
        models=tuple(data.get("models", ())),
        source=source,
    )


def load_traces(folder: Path) -> list[Trace]:
    """Every ``*.json`` trace in ``folder``, by file name; files with no requests left out."""
    traces = []
    for path in sorted(folder.glob("*.json")):
        trace = parse_trace(json.loads(path.read_text()), path.name)
        if trace.steps:
            traces.append(trace)
    return traces


def requests_in(steps: Iterable[Step]) -> Iterator[TraceRequest]:
    """Every request of ``steps``, sub-agents' included, depth first."""
    for step in steps:
        if isinstance(step, SubAgentGroup):
            for agent in step.agents:
                yield from requests_in(agent.steps)
        else:
            yield step


def timeline(steps: Iterable[Step], start: float = 0.0) -> list[tuple[float, TraceRequest]]:
    """Every request with its time from the conversation's start, in recorded order."""
    out: list[tuple[float, TraceRequest]] = []
    for step in steps:
        if isinstance(step, SubAgentGroup):
            for agent in step.agents:
                out += timeline(agent.steps, start + agent.t)
        else:
            out.append((start + step.t, step))
    out.sort(key=lambda pair: pair[0])
    return out


def parent_requests(trace: Trace) -> list[TraceRequest]:
    return [s for s in trace.steps if isinstance(s, TraceRequest)]


# -- Scale: a quick pass keeps the structure (blocks shared, tails) at fewer tokens ----------


@dataclass(frozen=True, slots=True)
class Scale:
    """Tokens per hash id and per tail at ``factor`` of the recorded sizes."""

    block_size: int  # the trace's
    factor: float = 1.0

    @property
    def block_tokens(self) -> int:
        return max(1, round(self.block_size * self.factor))

    def tail_tokens(self, request: TraceRequest) -> int:
        return round(request.tail(self.block_size) * self.factor)

    def prompt_tokens(self, request: TraceRequest) -> int:
        """The replayed prompt's length (at least one token)."""
        return max(len(request.hash_ids) * self.block_tokens + self.tail_tokens(request), 1)


def within_context(
    steps: Sequence[Step], length: Callable[[TraceRequest], int], limit: int
) -> tuple[Step, ...]:
    """``steps`` up to the first request longer than ``limit`` tokens (as the agent would stop).

    A sub-agent is cut the same way on its own; a group left with no agent is dropped.
    """
    kept: list[Step] = []
    for step in steps:
        if isinstance(step, SubAgentGroup):
            agents = tuple(
                replace(a, steps=cut)
                for a in step.agents
                if (cut := within_context(a.steps, length, limit))
            )
            if agents:
                kept.append(SubAgentGroup(agents))
            continue
        if length(step) > limit:
            break
        kept.append(step)
    return tuple(kept)


# -- Tokens: each hash id its own deterministic run of token ids ------------------------------


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """Token ids to draw from: ``[low, high)`` (the model's vocabulary less its special tokens)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.high <= self.low:
            raise ValueError(f"empty vocabulary [{self.low}, {self.high})")


@lru_cache(maxsize=1 << 16)
def seeded_tokens(seed: str, n: int, low: int, high: int) -> tuple[int, ...]:
    """``n`` token ids in ``[low, high)`` from SHA-256 of ``seed`` in counter mode.

    The same seed gives the same ids in every process and Python version (no ``random``,
    no ``hash``), so a replay sends the same prompts every time.
    """
    out: list[int] = []
    span = high - low
    counter = 0
    while len(out) < n:
        digest = hashlib.sha256(f"{seed}#{counter}".encode()).digest()
        out.extend(
            low + int.from_bytes(digest[i : i + 4], "little") % span for i in range(0, 32, 4)
        )
        counter += 1
    return tuple(out[:n])


@dataclass(frozen=True, slots=True)
class Synthesizer:
    """Prompts of token ids for one trace: a block per hash id, then the request's own tail.

    Hash ids are seeded within the trace (ids are local to their trace: two traces' id 7
    are different text), so equal ids give equal tokens and a perfect cache reuses exactly
    the prefix of ids seen before. A tail is seeded by the request's place in the trace.
    """

    trace_id: str
    scale: Scale
    vocabulary: Vocabulary

    def block(self, hash_id: int) -> tuple[int, ...]:
        v = self.vocabulary
        return seeded_tokens(
            f"{self.trace_id}:block:{hash_id}", self.scale.block_tokens, v.low, v.high
        )

    def prompt(self, request: TraceRequest, place: str) -> list[int]:
        """The token ids of ``request``; ``place`` names it uniquely within the trace."""
        ids: list[int] = []
        for h in request.hash_ids:
            ids.extend(self.block(h))
        v = self.vocabulary
        tail = max(self.scale.prompt_tokens(request) - len(ids), 0)
        ids.extend(seeded_tokens(f"{self.trace_id}:tail:{place}", tail, v.low, v.high))
        return ids


# -- A perfect cache: what a server with no limits would hold ---------------------------------


@dataclass
class PerfectCache:
    """Every block prefix ever sent, keyed by the chain of hash ids that leads to it.

    ``held`` is the number of leading blocks of a request whose whole chain was sent
    before (a prefix cache reuses a block only after the same blocks before it).
    """

    _chains: set[bytes] = field(default_factory=set)

    @staticmethod
    def _keys(namespace: str, hash_ids: Sequence[int]) -> Iterator[bytes]:
        key = hashlib.sha256(namespace.encode()).digest()
        for h in hash_ids:
            key = hashlib.sha256(key + h.to_bytes(8, "little", signed=True)).digest()
            yield key

    def held(self, namespace: str, hash_ids: Sequence[int]) -> int:
        n = 0
        for key in self._keys(namespace, hash_ids):
            if key not in self._chains:
                break
            n += 1
        return n

    def add(self, namespace: str, hash_ids: Sequence[int]) -> int:
        """Remember a request's blocks; the number that were new."""
        new = 0
        for key in self._keys(namespace, hash_ids):
            if key not in self._chains:
                self._chains.add(key)
                new += 1
        return new


def ideal_cached(held_blocks: int, block_tokens: int, prompt_tokens: int) -> int:
    """Tokens a perfect cache restores: the held blocks, less the one token always prefilled."""
    return max(min(held_blocks * block_tokens, prompt_tokens - 1), 0)


def trace_hit_rate(trace: Trace) -> float | None:
    """The share of input tokens a prefix cache held in the recorded order (the provider's
    view computed from hash ids: the format records no cache counts)."""
    cache = PerfectCache()
    held = total = 0
    for _, request in timeline(trace.steps):
        held += min(cache.held(trace.id, request.hash_ids) * trace.block_size, request.input_tokens)
        total += request.input_tokens
        cache.add(trace.id, request.hash_ids)
    return held / total if total else None


def distinct_blocks(traces: Iterable[Trace]) -> int:
    """Blocks over all ``traces`` counted once: the working set a cache holds to miss nothing."""
    cache = PerfectCache()
    return sum(
        cache.add(trace.id, request.hash_ids)
        for trace in traces
        for request in requests_in(trace.steps)
    )


# -- Accounting over replayed requests --------------------------------------------------------


def account(rows: Iterable[dict[str, Any]], ideal_key: str = "ideal") -> dict[str, Any]:
    """Totals of replayed requests: cached against ideal, prefill amplification.

    Each row has ``prompt_tokens``, ``cached_tokens`` (the server's usage) and
    ``ideal_key`` (``ideal_cached`` of it). Amplification is the tokens prefilled over the
    tokens a perfect cache leaves to prefill (1.0: nothing held was computed again).
    """
    prompt = cached = ideal = 0
    over = short = 0
    for row in rows:
        prompt += row["prompt_tokens"]
        cached += row["cached_tokens"]
        ideal += row[ideal_key]
        short += row["cached_tokens"] < row[ideal_key]
        over += row["cached_tokens"] > row[ideal_key]
    must_prefill = prompt - ideal
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "ideal_tokens": ideal,
        "cached_vs_ideal": cached / ideal if ideal else None,
        "prefilled_tokens": prompt - cached,
        "ideal_prefill_tokens": must_prefill,
        "amplification": (prompt - cached) / must_prefill if must_prefill else None,
        "requests_short": short,
        "requests_over": over,
    }


def round_robin(queues: Sequence[Sequence[Any]]) -> list[tuple[int, Any]]:
    """(queue index, item): one item from each queue in turn until all are empty."""
    order: list[tuple[int, Any]] = []
    depth = max((len(q) for q in queues), default=0)
    for i in range(depth):
        order.extend((k, q[i]) for k, q in enumerate(queues) if i < len(q))
    return order


def restart_points(n: int, restarts: int) -> set[int]:
    """Indices (of ``n`` steps) before which the server restarts: evenly spaced, never first."""
    if n < 2 or restarts < 1:
        return set()
    return {max(1, round(n * (i + 1) / (restarts + 1))) for i in range(restarts)} - {n}


def cache_header(value: str | None) -> tuple[int | None, str | None]:
    """``cached`` and ``tier`` of omlx's ``x-omlx-cache`` header (None where absent)."""
    fields = dict(
        part.strip().partition("=")[::2] for part in (value or "").split(";") if "=" in part
    )
    cached = fields.get("cached")
    return (int(cached) if cached and cached.isdigit() else None), fields.get("tier")
