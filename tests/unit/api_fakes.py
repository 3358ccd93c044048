"""Fakes for API unit tests: an engine that replays scripted events, a byte tokenizer.

The app under test is the real ``create_app`` over the real composition root
(``bootstrap(model=, engine=)``); only the model and the engine thread are replaced.
``FakeModel`` and ``FakeEngine`` follow the ``ChatModel`` and ``GenerationEngine`` ports
(``tests/unit/test_domain_imports.py`` checks them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omlx.app.settings import Settings
from omlx.app.wiring.bootstrap import bootstrap
from omlx.app.wiring.container import Container
from omlx.domain.generation import (
    Failed,
    Finished,
    GenerationEvent,
    GenerationRequest,
    PrefillStarted,
    TextDelta,
)
from tests.fakes import FakeGrammarCompiler

MODEL = "fake"
# The Host Litestar's TestClient sends: a name the browser guard answers only when listed.
TEST_CLIENT_HOST = "testserver.local"


class FakeTokenizer:
    """UTF-8 bytes as tokens; a template of ``<role>content`` lines; Qwen-style markers."""

    has_thinking = True
    think_start, think_end = "<think>", "</think>"
    has_tool_calling = True
    tool_call_start, tool_call_end = "<tool_call>", "</tool_call>"
    eos_token_ids = frozenset({0})

    @staticmethod
    def tool_parser(text: str, tools: Any) -> dict:
        return json.loads(text.strip())

    def __len__(self) -> int:
        return 256

    def get_vocab(self) -> dict[str, int]:  # one byte per token: a character is at least one
        return {chr(i): i for i in range(256)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())

    def decode(self, tokens: list[int]) -> str:
        return bytes(tokens).decode(errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        tools: Any = None,
        **kwargs: Any,
    ) -> str:
        lines = [f"<tools>{','.join(t['function']['name'] for t in tools)}"] if tools else []
        for m in messages:
            calls = "".join(
                f"<tool_call>{json.dumps(c['function'])}</tool_call>"
                for c in m.get("tool_calls", [])
            )
            lines.append(f"<{m['role']}>{m['content']}{calls}")
        if add_generation_prompt:
            lines.append("<assistant>")
        return "\n".join(lines)


@dataclass
class FakeModel:
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    model_id: str = MODEL
    context_length: int = 4096
    cache_supported: bool = True
    cache_unsupported_reason: str = ""
    layout: Any = None


Script = Callable[[GenerationRequest], list[GenerationEvent]]


def reply(*texts: str, cached: int = 0, reason: str = "stop") -> Script:
    """A script: the prompt is admitted, ``texts`` stream out, generation finishes."""

    def script(request: GenerationRequest) -> list[GenerationEvent]:
        n = len(request.prompt_tokens)
        return [
            PrefillStarted(cached, n),
            *(TextDelta(t) for t in texts),
            Finished(reason, n, len(texts), cached),
        ]

    return script


def fails_after(*texts: str) -> Script:
    def script(request: GenerationRequest) -> list[GenerationEvent]:
        n = len(request.prompt_tokens)
        return [
            PrefillStarted(0, n),
            *(TextDelta(t) for t in texts),
            Failed("the engine fell over"),
        ]

    return script


class FakeEngine:
    """Replays ``script(request)`` synchronously on submit; records submissions and cancels.

    ``queued`` and ``kv_token_capacity`` are for a test to set: a full queue, a memory guard.
    """

    def __init__(self, script: Script | None = None) -> None:
        self.script = script or reply("Hello", " world")
        self.submitted: list[GenerationRequest] = []
        self.cancelled: list[int] = []
        self.active = 0
        self.queued = 0
        self.kv_token_capacity: int | None = None
        self.last_submitted = 0.0

    def submit(self, request: GenerationRequest, emit: Callable[[GenerationEvent], None]) -> int:
        self.submitted.append(request)
        self.last_submitted = time.monotonic()
        for event in self.script(request):
            emit(event)
        return len(self.submitted)

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)


def fake_container(
    engine: FakeEngine | None = None, model: FakeModel | None = None, **settings: Any
) -> Container:
    settings.setdefault("max_queued_requests", 4)
    settings.setdefault("default_max_tokens", 16)
    settings.setdefault("allowed_hosts", (TEST_CLIENT_HOST,))
    return bootstrap(
        Settings(**settings),
        model=model or FakeModel(),
        engine=engine or FakeEngine(),
        grammars=FakeGrammarCompiler(),
        # An engine that runs a real prefix cache (the cache-control tests) shares it.
        prefix_cache=getattr(engine, "prefix_cache", None),
    )
