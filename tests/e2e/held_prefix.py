"""What the cache should have restored for each request an agent made, from what it sent.

Each recorded Messages request is rendered into tokens the way the server does (its
Anthropic translator, prompt normalizer, chat renderer and tokenizer, over the served
model's folder); a request shares with every earlier one the longest common prefix of
their tokens. A request the server took earlier that had ended when this one arrived is
held as its prompt and its answer (the answer's KV is computed while the model writes its
end of turn); one still running is held as its prompt (a prefix being computed is waited
for, not computed twice). The cache should restore that prefix in whole blocks, the prompt's
last token excepted (it is computed to sample from).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.recording_proxy import Exchange


@dataclass(frozen=True, slots=True)
class Turn:
    """One model call: its prompt's tokens, what usage says, and what it should have restored."""

    seq: int  # the order the proxy saw it in
    order: tuple[int, int]  # (the server's run, its number there): the order taken in
    tokens: tuple[int, ...]
    prompt: int  # usage: input + cache_creation + cache_read
    cached: int  # usage: cache_read_input_tokens
    held: int  # the whole blocks of the longest prefix held by an earlier request
    held_from: int | None  # that request's seq
    started: float
    ended: float

    @property
    def recomputed(self) -> int:
        """Tokens of a held prefix the server computed again."""
        return max(self.held - self.cached, 0)


class PromptTokens:
    """Renders recorded Anthropic requests into the server's prompt tokens for one model."""

    def __init__(self, model_dir: Path, model_id: str) -> None:
        from omlx.adapters.mlx.models.tokenizer_loader import load_tokenizer
        from omlx.app.api.anthropic.translate import Translator
        from omlx.app.chat.normalize import PromptNormalizer
        from omlx.app.chat.sealing import ReasoningSeal
        from omlx.app.chat.templates import ChatRenderer

        self.tokenizer = load_tokenizer(model_dir)
        self.renderer = ChatRenderer(self.tokenizer, model_id)
        self.translator = Translator(
            PromptNormalizer(),
            ReasoningSeal.for_folder(None),
            effort_kwarg=self.renderer.accepts_reasoning_effort,
        )
        self.model_id = model_id

    def __call__(self, body: bytes) -> list[int]:
        import msgspec

        from omlx.app.api.anthropic.schemas import MessagesRequest

        data = msgspec.json.decode(body, type=MessagesRequest)
        chat = self.translator.chat_request(data, self.model_id)
        text = self.renderer.render(chat.messages, chat.tools, chat.template_kwargs)
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def usage_of(exchange: Exchange) -> tuple[int, int]:
    """(prompt tokens, cached tokens) from the answer's last usage (streamed or not)."""
    usage = None
    for event in exchange.events():
        found = event.get("usage") or (event.get("message") or {}).get("usage")
        if found:
            usage = found
    assert usage is not None, f"request {exchange.seq} has no usage: {bytes(exchange.answer)!r}"
    cached = usage.get("cache_read_input_tokens") or 0
    written = usage.get("cache_creation_input_tokens") or 0
    return usage["input_tokens"] + written + cached, cached


def model_calls(exchanges: Sequence[Exchange]) -> list[Exchange]:
    return [
        e for e in exchanges if e.path.startswith("/v1/messages") and "count_tokens" not in e.path
    ]


def held_turns(
    exchanges: Sequence[Exchange],
    tokens_of: Callable[[bytes], list[int]],
    answer_of: Callable[[list[int]], list[int]],
    server_order: Callable[[Exchange], tuple[int, int]],
    block_size: int,
) -> list[Turn]:
    """Each model call with the prefix the cache should have restored for it, in the order
    the server took them.

    ``answer_of(prompt)``: the tokens the model wrote before its end of turn;
    ``server_order(exchange)``: (the server's run, its number for the request); two
    requests sent together reach the engine in either order."""
    calls = []
    for exchange in model_calls(exchanges):
        assert exchange.status == 200 and exchange.ended is not None, exchange
        prompt, cached = usage_of(exchange)
        calls.append((server_order(exchange), exchange, prompt, cached))
    turns: list[Turn] = []
    held: list[tuple[list[int], list[int], float, int]] = []  # prompt, answer, ended, seq
    for order, exchange, prompt, cached in sorted(calls, key=lambda c: c[0]):
        tokens = tokens_of(exchange.body)
        best, source = 0, None
        for before, answer, ended, seq in held:
            whole = before + answer if ended <= exchange.started else before
            shared = min(common_prefix(tokens, whole), len(tokens) - 1)
            if shared > best:
                best, source = shared, seq
        turns.append(
            Turn(
                exchange.seq,
                order,
                tuple(tokens),
                prompt,
                cached,
                best // block_size * block_size,
                source,
                exchange.started,
                exchange.ended,
            )
        )
        held.append((tokens, answer_of(tokens), exchange.ended, exchange.seq))
    return turns


def dump(turns: Sequence[Turn], path: Path) -> None:
    """The figures, one JSON object per request (for the test's log and docs)."""
    rows = [
        {
            "seq": t.seq,
            "server_request": t.order,
            "prompt": t.prompt,
            "rendered": len(t.tokens),
            "cached": t.cached,
            "held": t.held,
            "held_from": t.held_from,
            "seconds": round(t.ended - t.started, 3),
        }
        for t in turns
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
