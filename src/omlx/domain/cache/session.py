"""One request's face of the prefix cache: all the engine sees of it (DESIGN §2).

``PrefixCache.begin(prompt)`` looks the prompt up (its prefix pinned), then the engine
calls, on its own thread: ``restore()`` for the cache to start from, ``prefilled`` after
each prefill chunk, ``wants_decoded``/``decoded`` during decode (sliding layers),
``finished`` with the request's final cache, and ``close()`` when it leaves without one.
No call raises into the engine: a failed lookup or restore is a miss, a failed cut stops
capturing (what was kept stays). A no-store session (``store=False``) restores what it
finds and keeps nothing: no block cut, no write, no eviction, no recency on disk. ``seconds`` holds its lookup, restore and store time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from omlx.domain.cache.blocks import MISS, CachedPrefix, PrefixHit, PromptChain
from omlx.domain.cache.capture import RequestCapture
from omlx.domain.cache.keeper import BlockKeeper
from omlx.domain.cache.layout import CacheLayout
from omlx.domain.cache.matcher import PrefixMatcher
from omlx.domain.cache.ports import KeptCaches, KVCodec
from omlx.domain.cache.tally import Tally

log = logging.getLogger(__name__)

# Gives a running request's cache as it is now (a view cut from the batch), or None.
CacheView = Callable[[], Any]


class CacheSession:
    """The prefix cache for one request, from its lookup to its stored blocks."""

    def __init__(
        self,
        prompt: Sequence[int],
        *,
        matcher: PrefixMatcher,
        keeper: BlockKeeper,
        codec: KVCodec,
        layout: CacheLayout,
        kept: KeptCaches | None,
        tally: Tally,
        store: bool = True,
        root: str | None = None,
        chain: PromptChain | None = None,
    ) -> None:
        self._prompt = list(prompt)
        self._matcher, self._keeper, self._codec = matcher, keeper, codec
        self._layout, self._tally = layout, tally
        # A no-store request restores but keeps nothing, and leaves the kept caches be.
        self._root = root
        if root is not None and not layout.plain:
            # Restore points are anchored on the namespace's chain: a tenant of a hybrid
            # model neither reads nor writes the cache rather than share another's.
            store = False
        self.store = store
        self._kept = kept if store else None
        self.seconds = {"lookup": 0.0, "restore": 0.0, "store": 0.0}
        self.continued = False  # restored from a kept finished cache, not from blocks
        started = time.perf_counter()
        try:
            if root is not None and not layout.plain:
                self._hit = MISS
            else:
                self._hit = matcher.lookup(self._prompt, store=store, root=root, chain=chain)
        except Exception:  # the lookup unpinned what it took: serve the request as a miss
            log.exception("prefix lookup of a %d-token prompt failed; a miss", len(self._prompt))
            self._hit = MISS
        self.seconds["lookup"] = time.perf_counter() - started
        self._capture: RequestCapture | None = self._new_capture(self._prompt, self._hit)
        self._plan = self._capture.plan
        if not store:
            self._capture = None  # nothing is cut; the plan still says where chunks end

    @property
    def hit(self) -> PrefixHit:
        return self._hit

    @property
    def cached_tokens(self) -> int:
        """Prompt positions the restored cache holds (0 after a failed restore)."""
        return self._hit.cached_tokens

    @property
    def lost_tokens(self) -> int:
        """KV-matched positions recomputed for want of a restore point there (hybrids)."""
        return self._hit.lost_tokens

    def restored(self) -> CachedPrefix:
        """What this request restored, as a report reads it: the same lookup the restore
        used, so a response's report says what its usage does (call after ``restore``)."""
        hit, bs = self._hit, self._matcher.block_size
        ssd = hit.cold_hits * bs + (hit.partial_tokens if hit.partial_from_disk else 0)
        return CachedPrefix(
            tokens=hit.cached_tokens,
            prompt_tokens=len(self._prompt),
            hot_tokens=hit.cached_tokens - ssd,
            ssd_tokens=ssd,
            stored_next=hit.stored_next,
            computed_by=hit.computed_by if hit.cached_tokens else "",
            matched=hit.matched,
            evicted=hit.evicted,
        )

    def kept_prefix(self) -> Sequence[int]:
        """The prefix ``restore`` would take a kept finished cache for (empty: none will be
        asked for: a miss, or a no-store request). Until then the memory guard spares it."""
        if self._kept is None or not self._hit.cached_tokens:
            return ()
        return self._prompt[: self._hit.cached_tokens]

    @property
    def plan(self) -> tuple[int, ...]:
        """Positions past the restored prefix where prefill chunks must end (restore points)."""
        return self._plan

    def restore(self) -> Any:
        """A fresh engine cache holding the matched prefix, or None to prefill from 0.

        A kept finished cache holding the prefix is continued in place; otherwise the
        matched blocks are assembled. A failure turns the hit into a miss (read
        ``cached_tokens`` and ``plan`` after this call). Called once per request.
        """
        if not self._hit.cached_tokens:
            return None
        started = time.perf_counter()
        try:
            cache = self._kept.take(self._prompt, self._hit.cached_tokens) if self._kept else None
            if cache is not None:
                self.continued = True
                self._tally.add(continued_requests=1)
            else:
                cache = self._assemble_or_drop()
        except Exception:
            log.exception("restoring a %d-token prefix failed; recomputed", self._hit.cached_tokens)
            self._matcher.release(self._hit)
            cache = None
        if cache is None:
            self._miss()
        else:
            # Joined into ``cache``: the payloads are let go. Blocks RAM declined to keep
            # (``ProbationPolicy``) would otherwise stay alive beside the request's cache.
            self._hit = replace(self._hit, payloads=(), windows=(), state=None)
        self.seconds["restore"] += time.perf_counter() - started
        return cache

    def _assemble_or_drop(self) -> Any:
        """The matched blocks joined, or None when they do not fit the model or each other
        (``ValueError``): joined into the batch they would fail every request in its step,
        so they are dropped from RAM and disk and the prefix is recomputed."""
        try:
            return self._assemble()
        except ValueError as exc:
            log.warning(
                "the %d objects of a %d-token prefix cannot be restored (%s); dropped, recomputed",
                len(self._hit.keys),
                self._hit.cached_tokens,
                exc,
            )
            self._tally.add(dropped_restores=1)
            self._matcher.drop(self._hit)
            return None

    def _miss(self) -> None:
        """Serve the request as a miss after a failed restore: a capture from position 0."""
        self._hit = MISS
        capture = self._new_capture(self._prompt, MISS)
        self._plan = capture.plan
        self._capture = capture if self.store else None

    def prefilled(self, view: CacheView, position: int) -> None:
        """A prefill chunk ended: the cache holds ``[0, position)``; keep what it completed."""
        self._cut(view, position, prefill=True)

    def wants_decoded(self, position: int) -> bool:
        """Whether ``decoded`` has work at ``position`` (a block completed, sliding layers)."""
        return self._capture is not None and self._capture.wants_decoded(position)

    def decoded(self, view: CacheView, position: int) -> None:
        """During decode: the cache holds ``[0, position)``; keep the window KV it completed."""
        self._cut(view, position, prefill=False)

    def finished(self, tokens: Sequence[int] | None, cache: Any) -> None:
        """The request ended; ``cache`` holds exactly ``tokens`` (None: nothing to keep).

        Its prefix is unpinned first; then every block not yet kept is cut, and a plain
        layout's cache is kept whole for the next turn to continue.
        """
        self.close()
        if cache is None or not tokens or not self.store:
            return
        started = time.perf_counter()
        try:
            # A capture stopped by an error starts over: every block not in RAM is cut.
            capture = self._capture or self._new_capture(tokens, None)
            capture.finished(tokens, cache)
        except Exception:
            log.exception("could not keep the blocks of a finished %d-token request", len(tokens))
        finally:
            self._timed("store", started)
        self._capture = None
        if self._layout.plain and self._kept is not None:
            try:
                self._kept.keep(list(tokens), cache)
            except Exception:
                log.exception("could not keep a finished cache for the next turn")

    def close(self) -> None:
        """Unpin the matched prefix; harmless twice, and after ``finished``."""
        self._matcher.release(self._hit)

    def _cut(self, view: CacheView, position: int, *, prefill: bool) -> None:
        if self._capture is None:
            return
        started = time.perf_counter()
        try:
            cache = view()
            if cache is not None:
                if prefill:
                    self._capture.prefilled(cache, position)
                else:
                    self._capture.decoded(cache, position)
        except Exception:
            log.exception("could not keep the blocks at position %d; capturing stops", position)
            self._capture = None  # what was kept stays
        finally:
            self._timed("store", started)

    def _assemble(self) -> Any:
        payloads = list(self._hit.payloads)
        room = len(self._prompt) - self._hit.cached_tokens  # the tail the engine prefills next
        if self._layout.plain:
            return self._codec.assemble(payloads, room=room)
        return self._codec.assemble(
            payloads, windows=list(self._hit.windows), state=self._hit.state, room=room
        )

    def _new_capture(self, prompt: Sequence[int], hit: PrefixHit | None) -> RequestCapture:
        return RequestCapture(self._keeper, self._codec, self._layout, prompt, hit, root=self._root)

    def _timed(self, phase: str, started: float) -> None:
        seconds = time.perf_counter() - started
        self.seconds[phase] += seconds
        self._tally.add(store_calls=1, store_seconds=seconds)
        self._tally.set(last_store_seconds=seconds)
