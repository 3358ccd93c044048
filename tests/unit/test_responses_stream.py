"""Responses API streams over the fake engine: the documented event order, sequence numbers,
every event and response valid under the openai SDK's own types, cut and failed turns."""

from __future__ import annotations

import json

import anyio
from litestar.testing import TestClient
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from omlx.app.api.app import create_app
from omlx.app.api.responses.output import OutputBuilder, base_response
from omlx.app.api.responses.schemas import ResponsesRequest
from omlx.app.api.responses.stream import ResponseRun
from omlx.app.chat.output import Content
from omlx.app.chat.pipeline import Output, Started
from omlx.app.chat.sealing import ReasoningSeal
from tests.unit.api_fakes import MODEL, FakeEngine, fails_after, fake_container, reply
from tests.unit.test_api_streams import sse

TOOL = '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
F_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
EVENT = TypeAdapter(ResponseStreamEvent)


def stream(engine: FakeEngine, **body) -> list[dict]:
    """The stream's events, each checked: SSE name = type, valid as the SDK's event type."""
    with TestClient(create_app(fake_container(engine))) as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": "hi", "stream": True, **body})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = []
    for name, data in sse(r.text):
        event = json.loads(data)
        assert name == event["type"]
        EVENT.validate_python(event)  # raises on a malformed event
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_event_order_for_reasoning_text_and_a_tool_call():
    events = stream(
        FakeEngine(reply("<think>m", "m</think>", "Hi ", TOOL, cached=4)),
        tools=[F_TOOL],
        include=["reasoning.encrypted_content"],
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # function call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    created, final = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    Response.model_validate(final)
    reasoning, message, call = final["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "mm"}]
    assert reasoning["encrypted_content"].startswith("omlx1.") and reasoning["summary"] == []
    assert message["content"] == [{"type": "output_text", "text": "Hi ", "annotations": []}]
    assert call["name"] == "f" and json.loads(call["arguments"]) == {"a": 1}
    assert call["id"].startswith("fc_") and call["call_id"].startswith("call_")
    # Each item's done event carries the item as it ends up in the response.
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]
    assert {e["item_id"] for e in events if "item_id" in e} == {i["id"] for i in done}
    assert final["usage"]["input_tokens"] == len(b"<tools>f\n<user>hi\n<assistant>")
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert final["usage"]["output_tokens"] == 4
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2


def test_no_encrypted_content_unless_included():
    events = stream(FakeEngine(reply("<think>t</think>", "a")))
    (reasoning,) = [i for i in events[-1]["response"]["output"] if i["type"] == "reasoning"]
    assert "encrypted_content" not in reasoning


def test_an_empty_answer_is_one_empty_message():
    events = stream(FakeEngine(reply()))
    (item,) = events[-1]["response"]["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == ""


def test_cut_by_max_output_tokens_is_incomplete():
    events = stream(FakeEngine(reply("Hel", "lo", reason="length")), max_output_tokens=2)
    final = events[-1]
    assert final["type"] == "response.incomplete"
    response = final["response"]
    Response.model_validate(response)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][-1]["status"] == "incomplete"
    assert response["max_output_tokens"] == 2


def test_failure_after_the_start_is_an_error_event_then_response_failed():
    events = stream(FakeEngine(fails_after("part")))
    assert [e["type"] for e in events][-4:] == [
        "response.content_part.done",
        "response.output_item.done",
        "error",
        "response.failed",
    ]
    assert events[-2]["message"] == "the engine fell over"
    failed = events[-1]["response"]
    Response.model_validate(failed)
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "the engine fell over"}
    assert failed["output"][0]["status"] == "incomplete"


def test_plain_request_failure_is_a_500_in_openai_envelope():
    with TestClient(create_app(fake_container(FakeEngine(fails_after())))) as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": "hi"})
    assert r.status_code == 500
    assert r.json()["error"]["message"] == "the engine fell over"


def test_plain_response_validates_and_echoes_the_request():
    body = {
        "model": MODEL,
        "input": "hi",
        "instructions": "sys",
        "temperature": 0.2,
        "top_p": 0.5,
        "max_output_tokens": 9,
        "tool_choice": "auto",
        "tools": [F_TOOL],
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low", "summary": "auto"},
        "metadata": {"k": "v"},
        "store": False,
    }
    with TestClient(create_app(fake_container(FakeEngine(reply("ok"))))) as c:
        r = c.post("/v1/responses", json=body)
    response = r.json()
    Response.model_validate(response)
    assert response["id"].startswith("resp_") and response["object"] == "response"
    assert response["status"] == "completed" and response["error"] is None
    for key in ("instructions", "temperature", "top_p", "max_output_tokens", "tools", "metadata"):
        assert response[key] == body[key], key
    assert response["parallel_tool_calls"] is False and response["store"] is False
    assert response["reasoning"] == {"effort": "low", "summary": "auto"}
    assert response["text"] == {"format": {"type": "text"}}
    assert response["truncation"] == "disabled" and response["previous_response_id"] is None


def test_leaving_the_stream_closes_the_turn_events():
    """The client left (the body is closed): the chat events close too, which cancels the job."""
    closed = []

    async def events():
        try:
            yield Started(3, 0)
            yield Output([Content("a")])
            await anyio.sleep(3600)  # a turn still generating
        finally:
            closed.append(True)

    run = ResponseRun(
        base=base_response("resp_1", 0, ResponsesRequest(model=MODEL)),
        builder=OutputBuilder(ReasoningSeal(b"k" * 32)),
        items=[],
        previous_id=None,
        store=None,
        caching=False,
        count_tokens=len,
    )

    async def leave_after_the_first_delta() -> list[str]:
        stream = run.stream(events())
        kinds = []
        while "response.output_text.delta" not in kinds:
            kinds.append(json.loads((await stream.__anext__()).data)["type"])
        await stream.aclose()
        assert closed == [True]  # at once, not when the garbage collector gets to it
        return kinds

    assert anyio.run(leave_after_the_first_delta)[-1] == "response.output_text.delta"
    assert closed == [True]
