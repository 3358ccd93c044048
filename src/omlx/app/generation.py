"""The app's generation service: prompts in, engine events out, on the event loop.

It validates what the engine cannot (context length, limits), applies
backpressure (429 past the waiting queue), and bridges the engine thread's
events into an async iterator that cancels its request when abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from omlx.app.api.errors import APIError
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    TextDelta,
)


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class GenerationService:
    """What the HTTP controllers call; knows the model's tokenizer and the engine."""

    def __init__(self, engine: Any, model: Any, *, max_queued: int, default_max_tokens: int) -> None:
        self.engine = engine
        self.model = model
        self.tokenizer = model.tokenizer
        self.max_queued = max_queued
        self.default_max_tokens = default_max_tokens

    # ---- prompts ----------------------------------------------------------

    async def render_chat(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        return await anyio.to_thread.run_sync(self._render_chat, messages, tools)

    def _render_chat(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[int]:
        try:
            kwargs: dict[str, Any] = {"add_generation_prompt": True}
            if tools:
                kwargs["tools"] = tools
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        except Exception as exc:  # jinja raises on messages a template rejects
            raise APIError(400, f"the model's chat template rejected the messages: {exc}", param="messages") from exc
        return self.encode_text(text)

    def encode_text(self, text: str) -> list[int]:
        # The rendered template already holds its special tokens; don't add a BOS twice.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def build_request(
        self,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        seed: int | None,
        stop: str | list[str] | None,
        max_tokens_param: str = "max_tokens",
    ) -> GenerationRequest:
        """Validate limits and sampling values into an engine request (400 on nonsense)."""
        if not prompt_tokens:
            raise APIError(400, "the prompt is empty", param="messages")
        context = self.model.context_length
        if len(prompt_tokens) >= context:
            raise APIError(
                400,
                f"the prompt has {len(prompt_tokens)} tokens; this model's context is {context} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        if max_tokens < 1:
            raise APIError(400, f"{max_tokens_param} must be at least 1", param=max_tokens_param)
        max_tokens = min(max_tokens, context - len(prompt_tokens))
        temperature = 1.0 if temperature is None else temperature
        if not 0 <= temperature <= 2:
            raise APIError(400, "temperature must be between 0 and 2", param="temperature")
        top_p = 1.0 if top_p is None else top_p
        if not 0 < top_p <= 1:
            raise APIError(400, "top_p must be in (0, 1]", param="top_p")
        top_k = top_k or 0
        if top_k < 0:
            raise APIError(400, "top_k must be >= 0", param="top_k")
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if len(stops) > 16:
            raise APIError(400, "at most 16 stop sequences", param="stop")
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for t in prompt_tokens):
            raise APIError(400, f"token ids must be in [0, {vocab})", param="prompt")
        return GenerationRequest(
            prompt_tokens=tuple(prompt_tokens),
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature, top_p, top_k, seed),
            stop=stops,
        )

    # ---- running ----------------------------------------------------------

    def check_capacity(self) -> None:
        if self.engine.queued >= self.max_queued:
            raise APIError(
                429,
                f"the server is busy: {self.engine.queued} requests are waiting; retry shortly",
                code="queue_full",
                headers={"Retry-After": "1"},
            )

    async def events(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """The request's events until Finished or Failed; leaving early cancels it."""
        self.check_capacity()
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[GenerationEvent] = asyncio.Queue()

        def emit(event: GenerationEvent) -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, event)

        job_id = self.engine.submit(request, emit)
        finished = False
        try:
            while True:
                event = await inbox.get()
                if isinstance(event, Finished | Failed):
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:
                self.engine.cancel(job_id)

    async def complete(self, request: GenerationRequest) -> Completion:
        """Run to the end and collect the text (non-streaming responses)."""
        parts: list[str] = []
        events = self.events(request)
        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                elif isinstance(event, Failed):
                    raise APIError(500, event.message)
                elif isinstance(event, Finished):
                    return Completion(
                        "".join(parts),
                        event.reason,
                        event.prompt_tokens,
                        event.completion_tokens,
                        event.cached_tokens,
                    )
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
        raise APIError(500, "generation ended without a result")
