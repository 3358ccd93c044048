"""Validate bodies against OpenAI's published schemas (tests/fixtures/openai-schemas.json)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

FIXTURE = Path(__file__).parent / "fixtures" / "openai-schemas.json"
BASE = "urn:openai-schemas"


# The published completion schema says streamed chunks share its shape, but OpenAI's own
# stream (and its SDK) carries finish_reason null until the last chunk; omlx follows the
# wire, so non-final completion chunks are checked against this one relaxation.
COMPLETION_CHUNK = "CompletionStreamChunk"  # CreateCompletionResponse, finish_reason nullable


@cache
def _registry() -> Registry:
    document = json.loads(FIXTURE.read_text())
    schemas = document["components"]["schemas"]
    chunk = copy.deepcopy(schemas["CreateCompletionResponse"])
    finish = chunk["properties"]["choices"]["items"]["properties"]["finish_reason"]
    finish["type"], finish["enum"] = ["string", "null"], [*finish["enum"], None]
    schemas[COMPLETION_CHUNK] = chunk
    return Registry().with_resource(
        BASE, Resource.from_contents(document, default_specification=DRAFT202012)
    )


@cache
def validator(name: str) -> Draft202012Validator:
    """A validator for ``components.schemas[name]``; its ``#/components/...`` refs resolve in the document."""
    return Draft202012Validator(
        {"$ref": f"{BASE}#/components/schemas/{name}"}, registry=_registry()
    )


def problems(name: str, body: object) -> list[str]:
    """Every way ``body`` breaks schema ``name``, as readable lines (empty: valid)."""
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator(name).iter_errors(body)
    ]
