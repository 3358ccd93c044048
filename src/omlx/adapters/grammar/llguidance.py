"""Constrained decoding with llguidance: output grammars compiled for a model's tokenizer.

llguidance (MIT) computes the allowed-token bitmask of a JSON schema or Lark grammar in
tens of microseconds per step on a CPU and compiles a schema in milliseconds; it needs
only the tokenizer's ``tokenizer.json``. See docs/benchmarks.md for why it was chosen.

Compiled grammars are kept by ``OutputGrammar`` (LRU); each request gets a deep copy,
a fresh state that costs about a microsecond.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from llguidance import LLMatcher, LLTokenizer

from omlx.adapters.grammar.lark import lark_grammar
from omlx.adapters.grammar.one_of import ONE_OF_ADVICE
from omlx.domain.grammar import GrammarError, OutputGrammar

log = logging.getLogger(__name__)

# anyOf/oneOf branches of one schema node: llguidance's parser fails past about 2,000.
MAX_ALTERNATIVES = 1000


def tokenizer_json(tokenizer: Any) -> str:
    """The ``tokenizer.json`` text of an mlx-lm tokenizer wrapper, a HF fast tokenizer, or a
    ``tokenizers.Tokenizer``."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(inner, "backend_tokenizer", inner)
    if not hasattr(backend, "to_str"):
        raise GrammarError(
            "this model's tokenizer has no fast (tokenizers) form, which constrained decoding needs"
        )
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return backend.to_str()


class Constraint:
    """One request's grammar state (``ports.TokenConstraint``)."""

    __slots__ = ("_matcher", "vocab_size")

    def __init__(self, matcher: LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size

    def fill_bitmask(self, out: Any) -> None:
        self._matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def advance(self, token: int) -> bool:
        return bool(self._matcher.consume_token(token))

    def validate(self, tokens: list[int]) -> int:
        return int(self._matcher.validate_tokens(tokens))

    def rollback(self, count: int) -> None:
        self._matcher.rollback(count)

    def failure(self) -> str | None:
        return refusal_reason(self._matcher.get_error()) if self._matcher.is_error() else None


class LLGuidanceCompiler:
    """``ports.GrammarCompiler`` for one model.

    The tokenizer view llguidance needs takes 0.6-0.7 s to build for a 50k vocabulary,
    holding the GIL nearly all along (another thread got 4% of its usual progress): it is
    built on a background thread, from the start or from ``start_building`` (the server
    calls it once the model is quiet, so the build does not starve the first request), and
    whoever needs it first starts it if need be and waits.
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        vocab_size: int | None = None,
        cache_size: int = 64,
        *,
        build_now: bool = True,
    ) -> None:
        self._source = tokenizer
        self._eos = list(eos_token_ids)
        self._vocab_size = vocab_size
        self._cache: OrderedDict[OutputGrammar, LLMatcher] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._tokenizer: LLTokenizer | None = None
        self._error: GrammarError | None = None
        self._ready = threading.Event()
        self._started = False
        if build_now:
            self.start_building()

    def start_building(self) -> threading.Event:
        """Start the tokenizer view's build (once); the event is set when it is done."""
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(
                    target=self._build, name="omlx-grammar-tokenizer", daemon=True
                ).start()
        return self._ready

    def _build(self) -> None:
        try:
            text = tokenizer_json(self._source)
            size = max(self._vocab_size or 0, len(self._source)) or None
            self._tokenizer = LLTokenizer(text, n_vocab=size, eos_token=self._eos or None)
        except GrammarError as exc:
            self._error = exc
        except Exception as exc:  # llguidance refuses tokenizers it cannot read
            log.warning("constrained decoding is unavailable for this model: %s", exc)
            self._error = GrammarError(f"constrained decoding is unavailable for this model: {exc}")
        finally:
            self._ready.set()

    @property
    def tokenizer(self) -> LLTokenizer:
        self.start_building().wait()
        if self._tokenizer is None:
            raise self._error or GrammarError("constrained decoding is unavailable")
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def constraint(self, grammar: OutputGrammar) -> Constraint:
        return Constraint(self.compiled(grammar).deep_copy(), self.vocab_size)

    def compiled(self, grammar: OutputGrammar) -> LLMatcher:
        """The grammar's initial state, compiled once (milliseconds; never on the engine thread)."""
        with self._lock:
            found = self._cache.get(grammar)
            if found is not None:
                self._cache.move_to_end(grammar)
                return found
        for schema in (grammar.json_schema, *(c.parameters for c in grammar.calls)):
            if schema is not None:
                _check_alternatives(schema)
        tokenizer = self.tokenizer
        matcher = LLMatcher(tokenizer, lark_grammar(grammar, self._literal), log_level=0)
        if matcher.is_error():
            raise GrammarError(refusal_reason(matcher.get_error()))
        _check_it_can_start(matcher)
        with self._lock:
            self._cache[grammar] = matcher
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return matcher

    def _literal(self, marker: str) -> str:
        """A marker as Lark: ``<[id]>`` when it is one special token, else a string literal."""
        tokenizer = self.tokenizer
        ids = tokenizer.tokenize_str(marker)
        if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return _lark_string(marker)

    def token_bytes(self, token: int) -> bytes:
        return self.tokenizer.decode_bytes([token])


def _check_alternatives(schema_json: str) -> None:
    """A 400 for a schema with more alternatives than llguidance's parser takes at a step.

    An ``anyOf`` of 3,000 objects compiles, then fails at the first key (its parser holds
    at most 2,000 items per row); refusing it up front beats a truncated answer.
    """
    stack: list[Any] = [json.loads(schema_json)]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("anyOf", "oneOf"):
                branches = node.get(key)
                if isinstance(branches, list) and len(branches) > MAX_ALTERNATIVES:
                    raise GrammarError(
                        f"the schema is too large: an {key} of {len(branches)} alternatives "
                        f"(at most {MAX_ALTERNATIVES})"
                    )
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))


def _check_it_can_start(matcher: LLMatcher) -> None:
    """A grammar with no first token (a schema that only refers to itself has no values)
    compiles, then fails at the first step: refuse it now, as the client's mistake."""
    probe = matcher.deep_copy()
    mask = probe.compute_bitmask()
    if probe.is_error() or not any(mask):
        detail = refusal_reason(probe.get_error()) if probe.is_error() else "no token can start it"
        raise GrammarError(
            f"no output can satisfy it ({detail}): a schema whose $ref refers only to itself, "
            "directly or through others, has no values"
        )


def _lark_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def refusal_reason(error: str) -> str:
    """llguidance's whole reason, on one line, without its position (``at 3(9): ``), the
    grammar excerpt it quotes (omlx's grammar, not the client's) or caret lines.

    A regex it cannot take reads ``regex parse error in pattern '(a)\\1': backreferences
    are not supported``.
    """
    lines = []
    for line in error.strip().splitlines():
        if re.match(r"^\s*\d+ \| ", line):
            break  # the quoted grammar starts here
        if line.strip() and not re.fullmatch(r"\s*\^+\s*", line):
            lines.append(line.strip())
    if not lines:
        return "the grammar is invalid"
    text = re.sub(r"^at \d+\(\d+\): ", "", " ".join(lines))
    text = re.sub(r"regex parse error: (.*?) error: ", r"regex parse error in pattern '\1': ", text)
    return re.sub(
        r"oneOf constraints are not supported\.? ?Enable .coerce_one_of.[^.]*\.?",
        f"oneOf: {ONE_OF_ADVICE}",
        text,
    )
