"""schemathesis against ``/schema``: no generated request, valid or not, gets a 5xx."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

EXAMPLES = 10  # per operation and mode (20 per POST route); generating bodies dominates the time
CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "max_output_tokens": 4}


def cap_generation(case: schemathesis.Case) -> None:
    """Keep generated token budgets tiny: this tests the API's edges, not decoding speed."""
    if isinstance(case.body, dict):
        for name, cap in CAPS.items():
            value = case.body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                case.body[name] = cap
        if "max_tokens" not in case.body and "messages" in case.body:
            case.body["max_tokens"] = CAPS["max_tokens"]
        if "max_output_tokens" not in case.body and "input" in case.body:
            case.body["max_output_tokens"] = CAPS["max_output_tokens"]


def test_no_server_errors(tiny_server):
    schema = schemathesis.openapi.from_url(tiny_server.base_url + "/schema/openapi.json")
    seen: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        modes = [GenerationMode.POSITIVE] + (
            [GenerationMode.NEGATIVE] if operation.method.upper() == "POST" else []
        )
        for mode in modes:
            seen.append(f"{operation.method.upper()} {operation.path} {mode.value}")

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate],
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def no_5xx(case: schemathesis.Case) -> None:
                cap_generation(case)
                response = case.call(base_url=tiny_server.base_url, timeout=60)
                assert response.status_code < 500, (
                    f"{case.method} {case.path} body={case.body!r} -> {response.status_code} {response.text[:500]}"
                )

            no_5xx()
    assert {
        "POST /v1/chat/completions positive",
        "POST /v1/messages negative",
        "POST /v1/responses positive",
        "GET /metrics positive",
    } <= set(seen)
