"""What ``/schema`` says beyond the handlers' signatures: error envelopes and SSE bodies."""

from __future__ import annotations

from dataclasses import dataclass

from litestar.openapi import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIResponse, OpenAPIType, Operation, Schema
from msgspec import Struct

_DESCRIPTIONS = {
    400: "Invalid request (malformed JSON, a wrong field, a prompt past the context)",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Request body too large",
    429: "Too many requests waiting; retry after the Retry-After seconds",
    500: "Generation failed",
}


def error_responses(envelope: type[Struct], *statuses: int) -> dict[int, ResponseSpec]:
    """ResponseSpecs for ``statuses`` in one API's error envelope (they replace Litestar's 400)."""
    return {
        s: ResponseSpec(
            data_container=envelope, description=_DESCRIPTIONS[s], generate_examples=False
        )
        for s in statuses
    }


def streaming_operation(description: str) -> type[Operation]:
    """An Operation whose 200 also documents the ``text/event-stream`` body sent for ``stream: true``."""

    @dataclass
    class StreamingOperation(Operation):
        def __post_init__(self) -> None:
            ok = (self.responses or {}).get("200")
            if isinstance(ok, OpenAPIResponse) and ok.content is not None:
                ok.content["text/event-stream"] = OpenAPIMediaType(
                    schema=Schema(type=OpenAPIType.STRING, description=description)
                )

    return StreamingOperation
