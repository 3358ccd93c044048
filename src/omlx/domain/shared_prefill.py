"""One prefill per shared prefix in flight (issue 38): who waits for whose prefill, and how long.

An agent starts its sub-agents together: their prompts share a long prefix that no cache
holds yet. Admitted side by side, each would compute it. Instead, a request admitted while
a running request (its *leader*) is prefilling blocks it would restore waits, out of the
batch, while the leader keeps them chunk by chunk; then it looks its prompt up again,
restores them and computes only its own rest. Its slot and memory are held meanwhile, and
the batch's other rows go on decoding.

Waiting takes no more steps than computing. The batcher runs one chunk of every
prefilling row per step, so a follower waits only for a leader that reaches the end of the
shared blocks in no more steps than the follower would take to compute what it lacks of
them, and each of those steps is cheaper without the follower's chunk beside the leader's.
It waits at most that many steps (and ``PATIENCE`` more, for the step in which a leader's
last chunk is cut), and gives a leader up sooner when it keeps nothing for ``PATIENCE``
steps. A leader that leaves (cancelled, finished) ends the wait: the follower restores
what it kept and computes the rest.

Block keys are chain keys (``cache.keys``): two prompts share their first ``n`` blocks
exactly when their ``n``-th keys are equal, so the shared length is a binary search.
Pure: the engine counts steps and reports what each running request has kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# Steps a leader may keep nothing before a follower gives it up, and the slack on a wait's
# limit: a fused final chunk's blocks are cut a step after it runs.
PATIENCE = 3


def shared_blocks(a: Sequence[str], b: Sequence[str]) -> int:
    """How many leading blocks two prompts share, from their chain keys."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # the largest n whose n-th keys are equal
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class Prefilling:
    """A running request as a request that may wait for it sees it."""

    id: int
    keys: Sequence[str]  # the chain keys of its prompt's whole blocks
    kept: int  # prompt positions from the start whose blocks it has handed to the cache


@dataclass(frozen=True, slots=True)
class Wait:
    """A follower waits for ``leader`` to keep its first ``blocks`` blocks (``cached`` held)."""

    leader: int
    blocks: int
    cached: int

    @property
    def in_flight(self) -> int:
        """Blocks the follower would have computed again."""
        return self.blocks - self.cached


@dataclass(slots=True)
class _Waiting:
    wait: Wait
    since: int  # the step it began waiting for this leader
    limit: int  # the most steps it waits: what computing the blocks itself would take
    kept: int  # the leader's kept positions when last seen
    moved: int  # the step the leader last kept more
    given_up: set[int] = field(default_factory=set)  # leaders too slow to wait for


def steps_for(positions: int, step_size: int) -> int:
    """Prefill steps that compute ``positions`` positions (one chunk per step)."""
    return -(-max(positions, 0) // step_size)


class SharedPrefill:
    """The engine's admitted requests that wait for a running request's prefill."""

    def __init__(self, block_size: int, step_size: int, patience: int = PATIENCE) -> None:
        self.block_size = block_size
        # The batcher's chunks are whole blocks (``admission.segments``).
        self.step_size = block_size * max(1, step_size // block_size)
        self.patience = patience
        self._waiting: dict[int, _Waiting] = {}

    def __contains__(self, follower: int) -> bool:
        return follower in self._waiting

    def wait(
        self,
        follower: int,
        keys: Sequence[str],
        running: Iterable[Prefilling],
        cached: Callable[[Sequence[str]], int],
        step: int,
    ) -> Wait | None:
        """Whether ``follower`` (its prompt's chain ``keys``) waits for one of ``running``.

        ``cached(keys)``: how many of those keys, from the first, the cache holds now; asked
        once, only when some running request shares blocks. The leader: the one sharing the
        most blocks past those (the furthest along on a tie), which it has not kept yet and
        reaches in no more steps than the follower would take to compute them. None: it
        goes now (its record forgotten).
        """
        record = self._waiting.get(follower)
        given_up = record.given_up if record is not None else set()
        bs = self.block_size
        candidates = []
        for leader in running:
            if leader.id == follower or leader.id in given_up:
                continue
            n = shared_blocks(keys, leader.keys)
            if n and leader.kept < n * bs:
                candidates.append((n, leader.kept, leader.id))
        if not candidates:
            self._waiting.pop(follower, None)
            return None
        held = cached(keys[: max(n for n, _, _ in candidates)])
        # Worth waiting for: it covers blocks the cache lacks, no slower than computing them.
        worth = [
            (n, kept, leader)
            for n, kept, leader in candidates
            if n > held
            and steps_for(n * bs - kept, self.step_size)
            <= steps_for((n - held) * bs, self.step_size)
        ]
        if not worth:
            self._waiting.pop(follower, None)
            return None
        n, kept, leader = max(worth)
        chosen = Wait(leader, n, held)
        limit = steps_for((n - held) * bs, self.step_size) + self.patience
        self._waiting[follower] = _Waiting(chosen, step, limit, kept, step, given_up)
        return chosen

    def still_waiting(self, follower: int, kept: Mapping[int, int], step: int) -> bool:
        """Whether ``follower`` keeps waiting, ``kept`` giving each running request's kept
        positions. False once its leader kept the blocks, left, kept nothing for
        ``patience`` steps or overran the wait's limit (those two are given up): then ask
        ``wait`` again (another leader may cover more) or let it go."""
        record = self._waiting.get(follower)
        if record is None:
            return False
        leader = record.wait.leader
        now = kept.get(leader)
        if now is None or now >= record.wait.blocks * self.block_size:
            return False
        if now > record.kept:
            record.kept, record.moved = now, step
        if step - record.moved >= self.patience or step - record.since > record.limit:
            record.given_up.add(leader)
            return False
        return True

    def waiting_for(self, follower: int) -> Wait | None:
        record = self._waiting.get(follower)
        return record.wait if record is not None else None

    def forget(self, follower: int) -> None:
        """It went, or left while waiting."""
        self._waiting.pop(follower, None)
