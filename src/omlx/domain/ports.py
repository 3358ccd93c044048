"""Ports the adapters implement (DESIGN §3): the clock, grammars, and the generation engine
and its model as the app's services see them. The block cache's own are in
``domain/cache/ports.py``."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from omlx.domain.generation import GenerationEvent, GenerationRequest
from omlx.domain.grammar import OutputGrammar
from omlx.domain.images import PromptImage


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """The ``Clock`` of a running server: the system's wall clock."""

    def now(self) -> float:
        return time.time()


class TokenConstraint(Protocol):
    """One request's grammar state; the engine uses it on its own thread only."""

    vocab_size: int  # the mask covers token ids below it

    def fill_bitmask(self, out: Any) -> None:
        """Write the tokens allowed next into ``out``: ``ceil(vocab_size / 32)`` int32 words,
        bit ``i`` (little-endian) allowing token ``i``."""
        ...

    def advance(self, token: int) -> bool:
        """Take the token chosen; False when the grammar did not allow it."""
        ...

    def validate(self, tokens: list[int]) -> int:
        """How many of ``tokens``, in order, the grammar would take from here (taking none)."""
        ...

    def rollback(self, count: int) -> None:
        """Give back the last ``count`` tokens taken (speculative drafts the model refused)."""
        ...

    def failure(self) -> str | None:
        """Why the grammar can go no further (a limit of the grammar engine), or None."""
        ...


class GrammarCompiler(Protocol):
    """Compiles output grammars for one model's tokenizer (slow: never on the engine thread)."""

    def constraint(self, grammar: OutputGrammar) -> TokenConstraint:
        """A fresh state of ``grammar``, compiled once and cached; raises ``GrammarError``."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (for log-probabilities' ``bytes``)."""
        ...


# ---- the generation engine and its model, as the app's services see them ----------------
# Here rather than in the app: the MLX adapter implements them, and adapters may import
# only the domain. Their vocabulary (requests, events) is the domain's already.


class ModelWorker(Protocol):
    """A loaded model's worker thread, as the pool (is it in use?), /health and /metrics see it."""

    @property
    def queued(self) -> int:
        """Requests waiting for the worker (for a chat engine: for a batch slot)."""
        ...

    @property
    def active(self) -> int:
        """Requests the worker is running now."""
        ...

    @property
    def last_submitted(self) -> float:
        """``time.monotonic()`` of the latest request handed to the worker (0.0: none yet)."""
        ...


class GenerationEngine(ModelWorker, Protocol):
    """A chat model's engine: requests in, their events out on ``emit`` from its own thread.

    ``queued`` counts requests waiting for a batch slot: past the service's limit, a 429.
    """

    @property
    def kv_token_capacity(self) -> int | None:
        """The most positions (prompt + max_tokens) one request may use; None: no memory guard."""
        ...

    def submit(self, request: GenerationRequest, emit: Callable[[GenerationEvent], None]) -> int:
        """Queue ``request``; every event goes to ``emit``, ending with Finished or Failed.

        Returns the id ``cancel`` takes.
        """
        ...

    def cancel(self, job_id: int) -> None:
        """Drop the request before its next step (its client left); an ended one is ignored."""
        ...


class LayerKinds(Protocol):
    """What each layer of a model's cache keeps (kv, window W, state), for /health."""

    def counts(self) -> dict[str, int]: ...


class PromptImages(Protocol):
    """A vision-language model's prompt maker (``adapters/mlx/vision/prompts``)."""

    def key_tokens(
        self,
        text: str,
        images: Sequence[PromptImage],
        *,
        tenant: str | None = None,
        store: bool | None = None,
    ) -> list[int]:
        """The rendered prompt ``text``'s tokens, each image's as ``tenant``'s key ids for it
        (``domain/cache/image_keys``); the images are made known to the engine, with
        whether the request that runs may keep their rows (``store``; None: as known)."""
        ...

    def stats(self) -> dict[str, int | bool]:
        """The image rows: held in RAM (images, bytes), encoder passes, hits by tier."""
        ...

    def digest_at(self, token: int) -> str | None:
        """The digest of the image whose key ids hold ``token``, if this server knows it."""
        ...


class ChatModel(Protocol):
    """A loaded chat model as the app's services use it (the MLX loader's ``LoadedModel``)."""

    model_id: str
    context_length: int  # prompt + output tokens, at most
    cache_supported: bool
    cache_unsupported_reason: str
    layout: LayerKinds | None  # None: a plain KV model not probed, or no cache
    # mlx-lm's wrapper of the Hugging Face tokenizer: the chat template, the reasoning and
    # tool-call markers and the vocabulary the renderer and the output parser read are
    # that library's surface, not ours to restate.
    tokenizer: Any
