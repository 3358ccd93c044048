"""Cache-miss diagnostics: where a request's prompt left the one its conversation sent before.

Each chat turn leaves a *fingerprint*: the model, a digest per part of the request (the
system prompt, the tools, each message) and the prompt's tokens. The next turn of the same
conversation (named by the client, as Anthropic's ``diagnostics.previous_message_id``, or
else found as the recent prompt sharing the longest prefix) is compared with it: the first
part whose digest differs says what changed, the shared token prefix says where. Other
local servers leave users guessing why an agent's turn was slow.
"""

from __future__ import annotations

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from omlx.domain.images import PromptImage
from omlx.domain.json_values import JsonObject

# Anthropic's cache_miss_reason types, by the kind of part that changed.
_REASONS = {"model": "model_changed", "system": "system_changed", "tools": "tools_changed"}


@dataclass(frozen=True, slots=True)
class Fingerprint:
    model: str
    parts: tuple[
        tuple[str, str], ...
    ]  # (label, digest) in prompt order: system, tools, messages[k]
    tokens: bytes  # the prompt's token ids as uint32

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // 4


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first difference between a turn and the one before it."""

    reason: str  # model_changed | system_changed | tools_changed | messages_changed
    part: str  # "model", "system", "tools" or "messages[k]"
    token: int  # the first prompt token that differs
    missed_tokens: int  # the previous prompt's tokens past that point (cached, now unusable)

    @property
    def kind(self) -> str:
        return self.part.split("[", 1)[0]


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(
    model: str,
    messages: Sequence[JsonObject],
    labels: Sequence[str],
    tools: Sequence[JsonObject] | None,
    tokens: Sequence[int],
    images: Sequence[PromptImage] = (),
) -> Fingerprint:
    """``labels[i]`` names the request part ``messages[i]`` came from ("system", "messages[k]").

    An image's digest counts in its message's (its tokens may not change with its pixels).
    """
    grouped: OrderedDict[str, list[JsonObject]] = OrderedDict()
    digests = iter([image.digest for image in images])
    for label, message in zip(labels, messages, strict=True):
        grouped.setdefault(label, []).append(_with_digests(message, digests) if images else message)
    parts = [("system", _digest(grouped.pop("system", [])))]
    parts.append(("tools", _digest(list(tools or []))))
    parts.extend((label, _digest(group)) for label, group in grouped.items())
    return Fingerprint(model, tuple(parts), array("I", tokens).tobytes())


def _with_digests(message: JsonObject, digests: Iterator[str]) -> JsonObject:
    """``message`` with each image part naming its image's digest (the next of ``digests``)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = [
        {**p, "digest": next(digests, "")}
        if isinstance(p, dict) and p.get("type") == "image"
        else p
        for p in content
    ]
    return {**message, "content": parts}


def shared_tokens(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two uint32 token strings, in tokens."""
    lo, hi = 0, min(len(a), len(b)) // 4
    va, vb = memoryview(a), memoryview(b)
    while lo < hi:  # the longest n with a[:n] == b[:n], by halving (memcmp per step)
        mid = (lo + hi + 1) // 2
        if va[: mid * 4] == vb[: mid * 4]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def compare(previous: Fingerprint, current: Fingerprint) -> Divergence | None:
    """Where ``current`` stops continuing ``previous``; None when it extends it whole."""
    shared = shared_tokens(previous.tokens, current.tokens)
    missed = previous.n_tokens - shared
    if previous.model != current.model:
        return Divergence("model_changed", "model", 0, previous.n_tokens)
    mine = dict(current.parts)
    for label, digest in previous.parts:
        if mine.get(label) != digest:
            kind = label.split("[", 1)[0]
            return Divergence(_REASONS.get(kind, "messages_changed"), label, shared, max(missed, 0))
    return None


class FingerprintStore:
    """The recent turns' fingerprints by tenant and response id (bounded, oldest forgotten first).

    A tenant's turns are compared with its own alone: another tenant's prompt is never the
    "previous turn" a diagnosis names, nor a session a ``prompt_cache_key`` continues.
    """

    def __init__(self, limit: int = 128) -> None:
        self._limit = limit
        self._items: OrderedDict[tuple[str, str], Fingerprint] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, tenant: str | None, response_id: str, fp: Fingerprint) -> None:
        with self._lock:
            key = (tenant or "", response_id)
            self._items[key] = fp
            self._items.move_to_end(key)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def get(self, tenant: str | None, response_id: str) -> Fingerprint | None:
        with self._lock:
            return self._items.get((tenant or "", response_id))

    def closest(self, tenant: str | None, fp: Fingerprint) -> Fingerprint | None:
        """``tenant``'s recent turn of the same model whose prompt shares the longest prefix
        with ``fp``'s.

        Only turns sharing at least a block's worth of tokens count as the same conversation.
        """
        owner = tenant or ""
        with self._lock:
            candidates = [
                f
                for (t, _), f in reversed(self._items.items())
                if t == owner and f.model == fp.model
            ]
        head = fp.tokens[: 64 * 4]
        best, best_shared = None, 0
        for candidate in candidates:
            if candidate.tokens[: len(head)] != head:
                continue
            shared = shared_tokens(candidate.tokens, fp.tokens)
            if shared > best_shared:
                best, best_shared = candidate, shared
        return best if best_shared >= min(64, fp.n_tokens) else None
