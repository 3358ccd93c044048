"""``CacheControls``: what users see and steer of one served model's prefix cache.

One per served model, built with it. The chat pipeline asks it to probe a turn's prompt
(the probe travels to the engine, so the prompt is hashed and asked of the index once), to
put what the engine restored into words (the ``x-omlx-cache`` report) and to honour the
turn's pins; ``/v1/cache/*`` and the dashboard explain, pin, unpin, export, import and
clear through it. Every method that touches the index or hashes a prompt blocks: callers
run it off the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import IO

from omlx.app.cache_controls.controls import TurnControls
from omlx.app.cache_controls.hints import breakpoint_ends
from omlx.app.cache_controls.outcome import PromptHistory
from omlx.app.cache_controls.report import (
    CacheReport,
    ImageDigest,
    Markup,
    PromptParts,
    report,
)
from omlx.app.cache_controls.session_key import SessionKey
from omlx.app.cache_controls.transfer import (
    Archive,
    ExportStream,
    ImportRefused,
    ImportTooLarge,
    export_archive,
    import_blocks,
    read_archive,
)
from omlx.domain.cache.pins import Pin, PinRefused
from omlx.domain.cache.prefix_cache import PrefixCache
from omlx.domain.cache.probe import CachedPrefix
from omlx.domain.generation import GenerationRequest, PrefillStarted

log = logging.getLogger(__name__)

RETENTION_SOURCE = "prompt_cache_retention"
BREAKPOINT_SOURCE = "cache_control"


class NoPrefixCache(LookupError):
    """The model serves without a prefix cache (``--no-cache``, or a layout it cannot keep)."""


@dataclass(frozen=True, slots=True)
class PinView:
    """A live pin as its owner sees it: how many of its blocks are held now, and its time left."""

    pin: Pin
    held_blocks: int
    ttl_left: float


@dataclass(frozen=True, slots=True)
class Imported:
    blocks: int  # in the archive, all verified
    written: int  # now on disk and in the index
    present: int  # already there
    refused: dict[str, int]  # not written, per reason (no_space, queue_full, ...)
    tokens: int


@dataclass(frozen=True, slots=True)
class TenantUsage:
    lookups: int
    prompt_tokens: int
    cached_tokens: int
    pins: int


class CacheControls:
    """The prefix cache's user-facing controls for one model (``prefix_cache`` None: none)."""

    def __init__(
        self,
        prefix_cache: PrefixCache | None,
        decode: Callable[[Sequence[int]], str],
        *,
        excerpts: bool = True,
        image_digest: ImageDigest | None = None,
        markup: Markup | None = None,
    ) -> None:
        """``markup``: whether tokens are only the template's markup (the tokenizer's special
        tokens and whitespace), which lets a report name a follow-up's new message."""
        self._cache = prefix_cache
        self._decode = decode
        self._markup = markup
        self._image_digest = image_digest  # a VLM's: which image a key id belongs to
        # Off: reports say where a prompt left the cache, never what either holds there
        # (a key shared by several people shares one cache: the quote would be another's).
        self._excerpts = excerpts

    @property
    def enabled(self) -> bool:
        return self._cache is not None

    # ---- what the cache holds of a prompt ------------------------------------------------

    def look(self, prompt: Sequence[int], tenant: str | None) -> CachedPrefix | None:
        """What the tiers hold of ``prompt`` now, changing nothing; None without a cache."""
        if self._cache is None:
            return None
        return self._cache.probe(prompt, tenant)

    def report(
        self,
        found: CachedPrefix | None,
        prompt: Sequence[int],
        parts: PromptParts | None = None,
        *,
        store: bool = True,
        session: SessionKey | None = None,
        history: PromptHistory | None = None,
    ) -> CacheReport | None:
        """``found`` (what a request restored, or a probe found) in words: where the prompt
        leaves the cache, in which message, and why (``history``: what the app knows of its
        conversation); ``session``: the one the request named, reported with it."""
        if found is None:
            return None
        made = report(
            found,
            prompt,
            self._decode,
            parts or PromptParts(),
            self._image_digest,
            history,
            self._markup,
        )
        if not self._excerpts:
            made = replace(made, before="", prompt_next="", cached_next="", cached_image=None)
        if session is not None:
            made = replace(made, session=session.value, session_source=session.source)
        return made if store else replace(made, no_store=True)

    def explain(
        self, prompt: Sequence[int], tenant: str | None, session: SessionKey | None = None
    ) -> CacheReport:
        """The report of a raw prompt (no messages to name); nothing is run or changed."""
        found = self.look(prompt, tenant)
        if found is None:
            raise NoPrefixCache("this model has no prefix cache")
        made = self.report(found, prompt, session=session)
        assert made is not None
        return made

    def restored(self, started: PrefillStarted) -> CachedPrefix | None:
        """What the engine says it restored for a request, as a report reads it (None without
        a prefix cache); an engine that says only how many tokens gets a bare account."""
        if self._cache is None:
            return None
        if started.restored is not None:
            return started.restored
        cached = started.cached_tokens
        return CachedPrefix(cached, started.prompt_tokens, hot_tokens=cached, matched=cached)

    def apply(
        self, request: GenerationRequest, controls: TurnControls, found: CachedPrefix | None
    ) -> GenerationRequest:
        """``request`` as its controls ask: its tenant, no-store, and the probe's lookup, so the
        engine does not hash the prompt and ask the index again."""
        return replace(
            request,
            cache_tenant=controls.tenant,
            cache_store=controls.store,
            cache_probe=found,
            session=controls.session.value if controls.session is not None else None,
        )

    # ---- pins ----------------------------------------------------------------------------

    def pin(
        self,
        tokens: Sequence[int],
        ttl: float,
        *,
        source: str = "api",
        tenant: str | None = None,
        group: str | None = None,
    ) -> PinView:
        """Pin ``tokens``' prefix of ``tenant``'s blocks for ``ttl`` seconds (``PinRefused``)."""
        cache = self._require()
        pin = cache.pins.pin(
            tokens, ttl, source, group, root=cache.root_of(tenant), tenant=tenant or ""
        )
        return self._view(cache, pin)

    def pins(self, tenant: str | None) -> list[PinView]:
        """``tenant``'s live pins, soonest to expire first."""
        cache = self._cache
        if cache is None:
            return []
        return [self._view(cache, pin) for pin in cache.pins.pins(tenant or "")]

    def unpin(self, pin_id: str, tenant: str | None) -> bool:
        """Drop one of ``tenant``'s pins; another tenant's id is as unknown as a wrong one."""
        return self._cache is not None and self._cache.pins.unpin(pin_id, tenant or "")

    def honour(
        self,
        prompt: Sequence[int],
        controls: TurnControls,
        prefix_tokens: Callable[[int], Sequence[int]] | None = None,
    ) -> int:
        """Pin what a turn's controls ask (a no-store turn: nothing); the last breakpoint's offset.

        A pin that does not fit the pinned share is logged and skipped, never an error: the
        request is served. The offset bounds what Anthropic's usage reports as written.
        """
        if self._cache is None or not controls.store:
            return 0
        written = 0
        if controls.breakpoints and prefix_tokens is not None:
            ends = breakpoint_ends(prompt, controls.breakpoints, prefix_tokens)
            for end, ttl in ends:
                self._pin_quietly(prompt[:end], ttl, BREAKPOINT_SOURCE, controls.tenant, None)
            log.debug("cache_control: %d breakpoints at %s", len(ends), [e for e, _ in ends])
            written = ends[-1][0] if ends else 0
        if controls.retention is not None:
            self._pin_quietly(
                prompt, controls.retention, RETENTION_SOURCE, controls.tenant, controls.session_key
            )
        return written

    def _pin_quietly(
        self,
        tokens: Sequence[int],
        ttl: float,
        source: str,
        tenant: str | None,
        group: str | None,
    ) -> None:
        try:
            self.pin(tokens, ttl, source=source, tenant=tenant, group=group)
        except PinRefused as exc:
            log.info("a %s hint for %d tokens was not pinned: %s", source, len(tokens), exc)

    # ---- moving blocks between servers ------------------------------------------------------

    def export(self, tokens: Sequence[int], tenant: str | None) -> ExportStream:
        """The archive of what the disk tier holds of ``tokens``' prefix, as chunks read while
        they are sent (``ImportRefused`` when it holds nothing of it)."""
        return export_archive(self._require(), tokens, tenant)

    def import_(self, archive: IO[bytes], tenant: str | None, max_blocks: int) -> Imported:
        """Verify ``archive`` (a seekable file) whole for this model and tenant, then write
        what disk lacks, waiting for each write; at most ``max_blocks`` blocks."""
        cache = self._require()
        with Archive(archive) as opened:
            blocks = read_archive(opened, cache, tenant, max_blocks)
            counts = import_blocks(cache, opened, blocks)
        tokens = sum(b.meta.token_count for b in blocks)
        return Imported(len(blocks), counts.written, counts.present, counts.refused, tokens)

    # ---- counts and clearing --------------------------------------------------------------

    def usage(self, tenant: str | None) -> TenantUsage | None:
        """``tenant``'s lookups, prompt and restored tokens, and pins; None without a cache."""
        if self._cache is None:
            return None
        counts = self._cache.tenants.read(tenant or "")
        return TenantUsage(**counts, pins=len(self._cache.pins.pins(tenant or "")))

    def tenants(self) -> list[str]:
        """Every tenant this model has served or pins for (``""``: the default one)."""
        if self._cache is None:
            return []
        pinned = {pin.tenant for pin in self._cache.pins.pins()}
        return sorted(set(self._cache.tenants.tenants()) | pinned)

    def clear(self) -> int:
        """Drop every block in RAM and forget which are on disk (their files go separately);
        the blocks dropped."""
        return self._cache.clear() if self._cache is not None else 0

    def forget_stored(self) -> None:
        """Forget which blocks are on disk (a vacuum removed some), so they are written again."""
        if self._cache is not None:
            self._cache.forget_stored()

    def _require(self) -> PrefixCache:
        if self._cache is None:
            raise NoPrefixCache("this model has no prefix cache")
        return self._cache

    @staticmethod
    def _view(cache: PrefixCache, pin: Pin) -> PinView:
        return PinView(pin, cache.held_blocks(pin.keys), cache.pins.ttl_left(pin))


__all__ = [
    "CacheControls",
    "ExportStream",
    "ImportRefused",
    "ImportTooLarge",
    "Imported",
    "NoPrefixCache",
    "PinRefused",
    "PinView",
    "TenantUsage",
]
