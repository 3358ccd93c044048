"""A request's sampling settings as the APIs give them, validated into the engine's values.

Every field is what a client sent (None: not sent), so each error names the field at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from omlx.app.errors import InvalidRequest
from omlx.domain.generation import Penalties, SamplingParams

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    max_tokens_param: str = "max_tokens"  # the request field named in errors
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    # None: no log-probabilities; 0: the chosen token's; k: also the k most likely.
    logprobs: int | None = None
    logprobs_param: str = "top_logprobs"


def with_defaults(s: Sampling, defaults: Mapping[str, Any]) -> Sampling:
    """``s`` with the model's own defaults (its generation_config.json) where it sent none."""
    given = {
        k: v
        for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        if getattr(s, k) is None and (v := defaults.get(k)) is not None
    }
    return replace(s, **given) if given else s


def sampling_params(
    s: Sampling, vocab: int, defaults: Mapping[str, Any] | None = None
) -> SamplingParams:
    """The engine's sampling values; ``defaults`` stand in for what the request left out,
    then the OpenAI defaults (temperature 1, top_p 1)."""
    s = with_defaults(s, defaults or {})
    temperature = 1.0 if s.temperature is None else s.temperature
    if not 0 <= temperature <= 2:
        raise InvalidRequest("temperature must be between 0 and 2", param="temperature")
    top_p = 1.0 if s.top_p is None else s.top_p
    if not 0 < top_p <= 1:
        raise InvalidRequest("top_p must be in (0, 1]", param="top_p")
    top_k = s.top_k or 0
    if top_k < 0:
        raise InvalidRequest("top_k must be >= 0", param="top_k")
    min_p = s.min_p or 0.0
    if not 0 <= min_p <= 1:
        raise InvalidRequest("min_p must be in [0, 1]", param="min_p")
    seed = s.seed
    return SamplingParams(
        temperature,
        top_p,
        top_k,
        # OpenAI seeds are signed 64-bit; MLX keys take unsigned ones.
        None if seed is None else seed % 2**64,
        min_p,
        _penalties(s, vocab),
    )


def _penalties(s: Sampling, vocab: int) -> Penalties:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(s, name)
        if value is not None and not -2 <= value <= 2:
            raise InvalidRequest(f"{name} must be between -2 and 2", param=name)
    repetition = 1.0 if s.repetition_penalty is None else s.repetition_penalty
    if not 0 < repetition <= 10:
        raise InvalidRequest("repetition_penalty must be in (0, 10]", param="repetition_penalty")
    bias: tuple[tuple[int, float], ...] = ()
    if s.logit_bias:
        if len(s.logit_bias) > 300:
            raise InvalidRequest("logit_bias takes at most 300 tokens", param="logit_bias")
        for token, value in s.logit_bias.items():
            if not 0 <= token < vocab:
                raise InvalidRequest(
                    f"logit_bias: token ids must be in [0, {vocab})", param="logit_bias"
                )
            if not -100 <= value <= 100:
                raise InvalidRequest(
                    "logit_bias values must be between -100 and 100", param="logit_bias"
                )
        bias = tuple(sorted(s.logit_bias.items()))
    return Penalties(
        repetition=repetition,
        presence=s.presence_penalty or 0.0,
        frequency=s.frequency_penalty or 0.0,
        logit_bias=bias,
    )


def logprobs_count(n: int | None, param: str) -> int | None:
    if n is None:
        return None
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{param} must be between 0 and {MAX_TOP_LOGPROBS}", param=param)
    return n
