"""schemathesis against ``/schema``: no generated request, valid or not, gets a 5xx, on every
route (chat, completions, messages, count_tokens, responses, embeddings, rerank, models,
metrics), and a small request running beside the fuzzing is never held up past a bound."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

# Examples per operation and mode: a quick pass in the default run (~30 s), a thorough one
# with -m slow; generating bodies dominates the time.
EXAMPLES = [pytest.param(4, id="quick"), pytest.param(25, id="thorough", marks=pytest.mark.slow)]
CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "max_output_tokens": 4}
# The model each route's positive cases name, so they reach the handler (not a 404).
MODEL_FOR = {"/v1/embeddings": "emb", "/v1/rerank": "rr"}
SMALL_BOUND_S = 5.0  # a 1-token completion beside the fuzzing (alone: ~0.05-0.3 s)


def cap_generation(case: schemathesis.Case, positive: bool) -> None:
    """Keep generated token budgets tiny (this tests the API's edges, not decoding speed),
    and name a served model in positive cases."""
    if isinstance(case.body, dict):
        if positive and "model" in case.body:
            case.body["model"] = MODEL_FOR.get(case.path, "chat")
        for name, cap in CAPS.items():
            value = case.body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > cap:
                case.body[name] = cap
        if "max_tokens" not in case.body and "messages" in case.body:
            case.body["max_tokens"] = CAPS["max_tokens"]
        if "max_output_tokens" not in case.body and "input" in case.body:
            case.body["max_output_tokens"] = CAPS["max_output_tokens"]


class SmallRequests:
    """A 1-token completion every 0.2 s on a thread of its own, timed."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                r = client.post(
                    self.base_url + "/v1/completions",
                    json={"model": "chat", "prompt": "Hi", "max_tokens": 1},
                )
                self.latencies.append(time.monotonic() - started)
                if r.status_code != 200:
                    self.failures.append(f"{r.status_code} {r.text[:200]}")
                self._stop.wait(0.2)

    def __enter__(self) -> SmallRequests:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(130)


@pytest.mark.parametrize("examples", EXAMPLES)
def test_no_server_errors_and_no_stalls(all_tasks_server, examples):
    base = all_tasks_server.base_url
    schema = schemathesis.openapi.from_url(base + "/schema/openapi.json")
    seen: list[str] = []
    with SmallRequests(base) as probe:
        for result in schema.get_all_operations():
            operation = result.ok()
            modes = [GenerationMode.POSITIVE] + (
                [GenerationMode.NEGATIVE] if operation.method.upper() == "POST" else []
            )
            for mode in modes:
                seen.append(f"{operation.method.upper()} {operation.path} {mode.value}")
                positive = mode == GenerationMode.POSITIVE

                @settings(
                    max_examples=examples,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.generate],
                )
                @given(case=operation.as_strategy(generation_mode=mode))
                def no_5xx(case: schemathesis.Case) -> None:
                    cap_generation(case, positive)  # noqa: B023 (called in this iteration)
                    response = case.call(base_url=base, timeout=60)
                    assert response.status_code < 500, (
                        f"{case.method} {case.path} body={case.body!r} -> {response.status_code} {response.text[:500]}"
                    )

                no_5xx()
    assert {
        "POST /v1/chat/completions positive",
        "POST /v1/completions negative",
        "POST /v1/messages negative",
        "POST /v1/messages/count_tokens positive",
        "POST /v1/responses positive",
        "GET /v1/responses/{response_id} positive",
        "DELETE /v1/responses/{response_id} positive",
        "POST /v1/embeddings positive",
        "POST /v1/embeddings negative",
        "POST /v1/rerank positive",
        "POST /v1/rerank negative",
        "GET /metrics positive",
    } <= set(seen), sorted(seen)
    assert not probe.failures, probe.failures[:5]
    print(
        f"fuzzed {len(seen)} operation modes; {len(probe.latencies)} small requests beside, "
        f"slowest {max(probe.latencies):.3f} s"
    )
    assert probe.latencies and max(probe.latencies) < SMALL_BOUND_S, sorted(probe.latencies)[-5:]
