"""OpenAI request parameters beyond messages and tools: what omlx honours, and what it refuses.

The rule (DESIGN §6): a parameter that would change the output and that omlx does not
honour is a 400 naming it; one that changes nothing the model writes is accepted.
docs/api.md lists every parameter in one of the three, and a test walks that list.
"""

from __future__ import annotations

from omlx.app.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from omlx.app.chat.pipeline import ResponseFormat, Sampling
from omlx.app.errors import InvalidRequest
from omlx.domain.json_values import JsonObject

# OpenAI's efforts, as the values chat templates take (gpt-oss: low/medium/high).
EFFORT = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
}


def refuse_unsupported_chat(data: ChatCompletionRequest) -> None:
    for name in ("audio", "functions", "function_call", "web_search_options", "moderation"):
        if getattr(data, name) is not None:
            hint = "; send tools and tool_choice" if name.startswith("function") else ""
            raise InvalidRequest(f"{name} is not supported{hint}", param=name)
    if data.modalities is not None and data.modalities != ["text"]:
        raise InvalidRequest("modalities other than ['text'] are not supported", param="modalities")
    if data.verbosity not in (None, "medium"):
        raise InvalidRequest(
            f"verbosity {data.verbosity!r} is not supported (only the default, 'medium')",
            param="verbosity",
        )
    if data.top_logprobs is not None and not data.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")


def response_format_of(
    raw: JsonObject | None, param: str = "response_format"
) -> ResponseFormat | None:
    """``response_format`` (chat) or ``text.format`` (Responses): None for plain text."""
    if raw is None:
        return None
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat(None, strict=False, param=param)
    if kind == "json_schema":
        # Chat nests the schema under json_schema; Responses' text.format has it inline.
        spec = raw.get("json_schema") if "json_schema" in raw else raw
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None and "json_schema" in raw and isinstance(spec, dict):
            schema = {}  # chat's schema is optional: then any JSON value
        if not isinstance(schema, dict):
            where = f"{param}.json_schema.schema" if "json_schema" in raw else f"{param}.schema"
            raise InvalidRequest(f"{where} must be a JSON schema object", param=param)
        return ResponseFormat(schema, strict=spec.get("strict") is True, param=param)
    raise InvalidRequest(
        f"{param} type {kind!r} is not one of text, json_object, json_schema", param=param
    )


def effort_kwargs(effort: str | None, param: str, effort_kwarg: bool) -> JsonObject:
    """Template kwargs for a reasoning effort (where the template takes one)."""
    if effort is None:
        return {}
    if effort not in EFFORT:
        raise InvalidRequest(f"{param} {effort!r} is not one of {', '.join(EFFORT)}", param=param)
    kwargs: JsonObject = {}
    if effort == "none":
        kwargs["enable_thinking"] = False  # templates that can turn thinking off (Qwen3)
    if effort_kwarg:
        kwargs["reasoning_effort"] = EFFORT[effort]
    return kwargs


def logit_bias_of(raw: dict[str, float] | None) -> dict[int, float] | None:
    if not raw:
        return None
    try:
        return {int(k): float(v) for k, v in raw.items()}
    except ValueError as exc:
        raise InvalidRequest("logit_bias keys must be token ids", param="logit_bias") from exc


def chat_sampling(data: ChatCompletionRequest) -> Sampling:
    explicit_new = data.max_completion_tokens is not None
    return Sampling(
        max_tokens=data.max_completion_tokens if explicit_new else data.max_tokens,
        temperature=data.temperature,
        top_p=data.top_p,
        top_k=data.top_k,
        seed=data.seed,
        stop=data.stop,
        max_tokens_param="max_completion_tokens" if explicit_new else "max_tokens",
        min_p=data.min_p,
        repetition_penalty=data.repetition_penalty,
        presence_penalty=data.presence_penalty,
        frequency_penalty=data.frequency_penalty,
        logit_bias=logit_bias_of(data.logit_bias),
        logprobs=(data.top_logprobs or 0) if data.logprobs else None,
        logprobs_param="top_logprobs",
    )


def completion_sampling(data: CompletionRequest) -> Sampling:
    if data.best_of not in (None, 1):
        raise InvalidRequest("best_of must be 1: omlx generates one choice", param="best_of")
    if data.suffix:
        raise InvalidRequest("suffix (insertion) is not supported", param="suffix")
    if data.echo and data.logprobs is not None:
        raise InvalidRequest(
            "echo with logprobs needs the prompt's log-probabilities, which omlx does not compute",
            param="logprobs",
        )
    return Sampling(
        max_tokens=data.max_tokens if data.max_tokens is not None else 16,
        temperature=data.temperature,
        top_p=data.top_p,
        top_k=data.top_k,
        seed=data.seed,
        stop=data.stop,
        min_p=data.min_p,
        repetition_penalty=data.repetition_penalty,
        presence_penalty=data.presence_penalty,
        frequency_penalty=data.frequency_penalty,
        logit_bias=logit_bias_of(data.logit_bias),
        logprobs=data.logprobs,
        logprobs_param="logprobs",
    )
