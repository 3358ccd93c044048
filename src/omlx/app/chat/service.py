"""The app's generation service: prompts in, engine events out, on the event loop.

It validates what the engine cannot (context length, limits), applies
backpressure (429 past the waiting queue), and bridges the engine thread's
events into an async iterator that cancels its request when abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import anyio

from omlx.app.chat.observers import ModelObservers
from omlx.app.chat.prompt_limit import PromptLimit
from omlx.app.chat.sampling import Sampling, sampling_params
from omlx.app.chat.sampling import logprobs_count as _logprobs
from omlx.app.errors import Busy, GenerationFailed, InvalidRequest
from omlx.app.progress import PrefillWatch
from omlx.app.stop_signal import StopSignal
from omlx.domain.cache.image_keys import is_image_id
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationEvent,
    GenerationRequest,
    PrefillProgress,
    TextDelta,
    TokenLogprob,
)
from omlx.domain.grammar import GrammarError, OutputGrammar
from omlx.domain.images import PromptImage
from omlx.domain.ports import ChatModel, GenerationEngine, GrammarCompiler, PromptImages


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stop_sequence: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


class GenerationService:
    """What the HTTP controllers call; knows the model's tokenizer and the engine."""

    def __init__(
        self,
        engine: GenerationEngine,
        model: ChatModel,
        *,
        max_queued: int,
        default_max_tokens: int,
        encode: Callable[[str], list[int]] | None = None,
        grammars: GrammarCompiler | None = None,
        sampling_defaults: Mapping[str, Any] | None = None,
        observer: ModelObservers | None = None,
        images: PromptImages | None = None,
        stop: StopSignal | None = None,
    ) -> None:
        self.engine = engine
        self.stop = stop or StopSignal()  # the server's: its stop ends every generation
        self.images = images  # a vision-language model's prompt maker; None: text only
        self.sampling_defaults = dict(sampling_defaults or {})  # the model's generation_config
        self.grammars = grammars
        self.model = model
        self.tokenizer = model.tokenizer
        # The tokenizer's own encode unless a faster equal one is given (a growing
        # conversation's tokens reused: adapters.mlx.models.prompt_tokens).
        self._encode = encode or (
            lambda text: list(self.tokenizer.encode(text, add_special_tokens=False))
        )
        self.prompt_limit = PromptLimit.of(self.tokenizer, model.context_length)
        self.max_queued = max_queued
        self.default_max_tokens = default_max_tokens
        # Metrics and the dashboard's request log hear of each generation through it.
        self.observer = observer
        self.in_flight = 0  # generations being streamed (the event loop's count: the pool reads it)

    @property
    def accepts_images(self) -> bool:
        """Whether the model reads images in its prompt (a vision-language model's service)."""
        return self.images is not None

    # ---- prompts ----------------------------------------------------------

    def encode_text(self, text: str, param: str = "messages") -> list[int]:
        # The rendered template already holds its special tokens; don't add a BOS twice.
        # Call it off the event loop: a long prompt takes a while (chat.py, the controllers).
        self.prompt_limit.check(text, param)
        try:
            return self._encode(text)
        except Exception as exc:  # e.g. lone surrogates from a JSON \ud800 escape
            raise InvalidRequest(f"the text cannot be tokenized: {exc}", param=param) from exc

    def encode_prompt(
        self,
        text: str,
        images: Sequence[PromptImage],
        param: str = "messages",
        *,
        tenant: str | None = None,
        store: bool | None = None,
    ) -> list[int]:
        """``encode_text`` for a prompt with images: their placeholders expanded by the
        model's processor and keyed by image and ``tenant`` (``PromptImages.key_tokens``;
        ``store``: whether the turn that runs may keep their rows). Off the loop."""
        if not images:
            return self.encode_text(text, param)
        if self.images is None:
            raise InvalidRequest(
                f"model {self.model.model_id!r} does not take images", param=images[0].part
            )
        self.prompt_limit.check(text, param)
        try:
            return self.images.key_tokens(text, images, tenant=tenant, store=store)
        # The processor refused the image or the prompt (mlx-vlm's raise ValueError,
        # TypeError or IndexError on sizes they cannot cut): the client's image, a 400.
        except (ValueError, TypeError, IndexError) as exc:
            raise InvalidRequest(
                f"the images cannot be read by the model: {exc}", param=images[0].part
            ) from exc

    def check_token_ids(
        self, tokens: Sequence[int], param: str = "prompt", image_ids: bool = False
    ) -> int:
        """Refuse ids outside the vocabulary (a client's mistake, never a 500); its size.

        ``image_ids``: the prompt was made with its images (``encode_prompt``), so their
        key ids are in it too; a client's own token ids never may be."""
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab and not (image_ids and is_image_id(t)) for t in tokens):
            raise InvalidRequest(f"token ids must be in [0, {vocab})", param=param)
        return vocab

    def build_request(
        self,
        prompt_tokens: Sequence[int],
        sampling: Sampling | None = None,
        images: Sequence[PromptImage] = (),
    ) -> GenerationRequest:
        """Validate limits and sampling values into an engine request (400 on nonsense)."""
        s = sampling or Sampling()
        if not prompt_tokens:
            raise InvalidRequest("the prompt is empty", param="messages")
        context = self.model.context_length
        if len(prompt_tokens) >= context:
            raise InvalidRequest(
                f"the prompt has {len(prompt_tokens)} tokens; this model's context is {context} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        max_tokens, param = s.max_tokens, s.max_tokens_param
        explicit_max_tokens = max_tokens is not None
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        if max_tokens < 1:
            raise InvalidRequest(f"{param} must be at least 1", param=param)
        max_tokens = min(max_tokens, context - len(prompt_tokens))
        max_tokens = self._fit_kv_memory(len(prompt_tokens), max_tokens, explicit_max_tokens, param)
        stops = (s.stop,) if isinstance(s.stop, str) else tuple(s.stop or ())
        if len(stops) > 16:
            raise InvalidRequest("at most 16 stop sequences", param="stop")
        vocab = self.check_token_ids(prompt_tokens, image_ids=bool(images))
        return GenerationRequest(
            prompt_tokens=tuple(prompt_tokens),
            images=tuple(images),
            max_tokens=max_tokens,
            sampling=sampling_params(s, vocab, self.sampling_defaults),
            stop=stops,
            logprobs=_logprobs(s.logprobs, s.logprobs_param),
        )

    async def constrain(
        self, request: GenerationRequest, grammar: OutputGrammar, param: str
    ) -> GenerationRequest:
        """``request`` with a fresh state of ``grammar``, compiled off the event loop and the
        engine thread (milliseconds; cached by grammar). An unenforceable schema is a 400."""
        if self.grammars is None:
            raise InvalidRequest(
                f"{param} needs constrained decoding, which this server does not have", param=param
            )
        try:
            constraint = await anyio.to_thread.run_sync(self.grammars.constraint, grammar)
        except GrammarError as exc:
            raise InvalidRequest(f"{param} cannot be enforced: {exc}", param=param) from exc
        return replace(request, constraint=constraint)

    def token_text(self, token: int) -> tuple[str, bytes]:
        """A generated token as text and as the bytes it stands for (log-probabilities)."""
        if self.grammars is not None:
            raw = self.grammars.token_bytes(token)
        else:
            raw = self.tokenizer.decode([token]).encode()
        return raw.decode("utf-8", errors="replace"), raw

    def _fit_kv_memory(self, prompt: int, max_tokens: int, explicit: bool, param: str) -> int:
        """The engine's memory guard, up front: 400 when the request could never fit alone.

        A defaulted max_tokens is lowered to fit instead, as for the context length.
        """
        capacity = self.engine.kv_token_capacity
        if capacity is None or prompt + max_tokens <= capacity:
            return max_tokens
        if explicit or prompt >= capacity:
            raise InvalidRequest(
                f"the prompt ({prompt} tokens) plus {param} ({max_tokens}) needs more KV cache than "
                f"kv_memory_limit allows: at most {capacity} tokens in all; lower {param} or shorten the prompt",
                param=param if explicit and prompt < capacity else "messages",
                code="kv_memory_exceeded",
            )
        return capacity - prompt

    # ---- running ----------------------------------------------------------

    def check_capacity(self) -> None:
        """503 once the server is stopping; 429 when the engine's waiting queue is full
        (``max_queued_requests``)."""
        self.stop.check()
        if self.engine.queued >= self.max_queued:
            raise Busy(
                f"the server is busy: {self.engine.queued} requests are waiting; retry shortly"
            )

    def stream(
        self, request: GenerationRequest, keepalive: float | None = None
    ) -> AsyncGenerator[GenerationEvent | None, None]:
        """``request``'s events (``events``), or a 429 now when the queue is full.

        Checked here, when the handler asks, not when the stream is first read: a 429 is
        possible only before the 200, and a streamed response has begun by then.
        """
        self.check_capacity()
        return self.events(request, keepalive)

    async def events(
        self, request: GenerationRequest, keepalive: float | None = None
    ) -> AsyncGenerator[GenerationEvent | None, None]:
        """The request's events until Finished or Failed; ``None`` after ``keepalive`` quiet seconds.

        Prefill progress is logged for long prompts (``PrefillWatch``), not yielded. Leaving
        early (a closed client) cancels the request on the engine, which drops it before its
        next decode step and keeps what it prefilled. The server's stop raises
        ``ServerStopping`` here at once, and cancels it the same way. No capacity check:
        ``stream`` and ``complete`` make it first.
        """
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[GenerationEvent | None] = asyncio.Queue()  # None: the stop
        watch = PrefillWatch(self.model.model_id)

        def emit(event: GenerationEvent) -> None:
            watch(event)  # on the engine thread, as each chunk completes
            # RuntimeError: the loop has closed (shutdown) and nobody is listening.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(inbox.put_nowait, event)

        started = time.monotonic()
        job_id = watch.request_id = self.engine.submit(request, emit)
        self.in_flight += 1
        finished = first = False
        ttft: float | None = None
        # One pending get, reused across quiet spells, so a timeout never loses an event.
        getter: asyncio.Future[GenerationEvent | None] | None = None
        try:
            with self.stop.listening(partial(inbox.put_nowait, None)):
                while True:
                    if getter is None:
                        getter = asyncio.ensure_future(inbox.get())
                    done, _ = await asyncio.wait({getter}, timeout=keepalive)
                    if not done:
                        yield None
                        continue
                    event, getter = getter.result(), None
                    self.stop.check()  # stopping: the tokens still queued are cut too
                    if event is None or isinstance(event, PrefillProgress):
                        continue
                    if isinstance(event, TextDelta) and not first:
                        first = True
                        ttft = time.monotonic() - started
                        self._observe_first(ttft)
                    if isinstance(event, Finished | Failed):
                        finished = True
                        if isinstance(event, Finished):
                            self._observe_finished(event)
                            if self.observer is not None:
                                decode = (
                                    time.monotonic() - started - ttft if ttft is not None else 0.0
                                )
                                self.observer.completed(event, ttft, decode)
                    yield event
                    if finished:
                        return
        finally:
            self.in_flight -= 1
            if getter is not None:
                getter.cancel()
            if not finished:
                self.engine.cancel(job_id)
                if self.observer is not None:
                    self.observer.cancelled()

    async def complete(self, request: GenerationRequest) -> Completion:
        """Run to the end and collect the text (non-streaming responses); 429 when the queue is full."""
        return await self.collect(self.stream(request))

    async def collect(self, events: AsyncGenerator[GenerationEvent | None, None]) -> Completion:
        """A request's ``stream`` (or a caller's wrapping of it) run to the end, its text
        collected; closed on the way out."""
        parts: list[str] = []
        logprobs: list[TokenLogprob] = []
        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                    logprobs.extend(event.logprobs)
                elif isinstance(event, Failed):
                    raise GenerationFailed(event.message)
                elif isinstance(event, Finished):
                    return Completion(
                        "".join(parts),
                        event.reason,
                        event.prompt_tokens,
                        event.completion_tokens,
                        event.cached_tokens,
                        event.stop_sequence,
                        tuple(logprobs),
                    )
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
        raise GenerationFailed("generation ended without a result")

    def _observe_first(self, seconds: float) -> None:
        if self.observer is not None:
            self.observer.first_token(seconds)

    def _observe_finished(self, event: Finished) -> None:
        if self.observer is not None:
            self.observer.finished(event)
