"""Stored responses: the in-memory store and its retention, and the routes that read them
(GET, DELETE, input_items) over the fake engine."""

from __future__ import annotations

import time

import pytest
from litestar.testing import TestClient
from openai.types.responses import Response, ResponseItem
from pydantic import TypeAdapter

from omlx.app.api.app import create_app
from omlx.app.wiring.responses_store import MemoryResponseStore
from omlx.domain.responses import DAY, Retention, StoredResponse
from tests.fakes import FakeClock
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container, reply

ITEM = TypeAdapter(ResponseItem)


def record(rid: str, at: float) -> StoredResponse:
    return StoredResponse(rid, at, {"id": rid, "output": [{"id": f"o{rid}"}]}, [{"id": f"i{rid}"}])


def test_retention_rule():
    rule = Retention(max_responses=3, max_age_days=2)
    assert rule.cutoff(10 * DAY) == 8 * DAY
    assert [rule.excess(n) for n in (0, 3, 5)] == [0, 0, 2]
    with pytest.raises(ValueError):
        Retention(max_responses=-1)
    with pytest.raises(ValueError):
        Retention(max_age_days=0)


def test_memory_store_keeps_at_most_n_and_nothing_past_the_age():
    clock = FakeClock(100 * DAY)
    store = MemoryResponseStore(Retention(max_responses=3, max_age_days=2), clock=clock.now)
    for i in range(5):
        store.put(record(f"r{i}", clock.now() + i))
    assert len(store) == 3
    assert [store.get(f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert store.get("r4").output_items == [{"id": "or4"}]
    store.put(record("old", clock.now() - 3 * DAY))  # written already expired: pruned at once
    assert store.get("old") is None and len(store) == 3
    clock.advance(2 * DAY + 3.5)  # r2 and r3 are now past the age; nothing was written since
    assert store.get("r2") is None and store.get("r4") is not None
    store.put(record("r5", clock.now()))
    assert len(store) == 2
    assert store.delete("r4") and not store.delete("r4") and store.get("r4") is None


def test_memory_store_replaces_a_record_with_the_same_id():
    store = MemoryResponseStore(Retention(max_responses=2))
    store.put(record("a", time.time()))
    store.put(StoredResponse("a", time.time(), {"id": "a", "output": []}))
    assert store.get("a").output_items == [] and len(store) == 1


def test_zero_retention_stores_nothing():
    store = MemoryResponseStore(Retention(max_responses=0))
    store.put(record("a", time.time()))
    assert store.get("a") is None


def test_the_app_without_an_ssd_tier_stores_in_memory():
    assert isinstance(fake_container().responses, MemoryResponseStore)


def test_get_delete_and_input_items():
    with TestClient(create_app(fake_container(FakeEngine(reply("ok"))))) as c:
        items = [
            {"role": "developer", "content": "d"},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "three"},
        ]
        first = c.post("/v1/responses", json={"model": MODEL, "input": items}).json()
        second = c.post(
            "/v1/responses",
            json={"model": MODEL, "input": "four", "previous_response_id": first["id"]},
        ).json()
        unstored = c.post("/v1/responses", json={"model": MODEL, "input": "x", "store": False})
        bad_item = c.post(  # named by its place in this request, not in the conversation
            "/v1/responses",
            json={
                "model": MODEL,
                "input": [{"type": "image_generation_call"}],
                "previous_response_id": first["id"],
            },
        )
        got = c.get(f"/v1/responses/{first['id']}")
        desc = c.get(f"/v1/responses/{second['id']}/input_items").json()
        asc = c.get(f"/v1/responses/{second['id']}/input_items?order=asc&limit=2").json()
        after = c.get(
            f"/v1/responses/{second['id']}/input_items",
            params={"order": "asc", "after": asc["last_id"], "limit": 10},
        ).json()
        bad_after = c.get(f"/v1/responses/{second['id']}/input_items?after=nope")
        bad_limit = c.get(f"/v1/responses/{second['id']}/input_items?limit=0")
        streamed = c.get(f"/v1/responses/{first['id']}?stream=true")
        deleted = c.delete(f"/v1/responses/{first['id']}")
        gone = [
            c.get(f"/v1/responses/{first['id']}"),
            c.delete(f"/v1/responses/{first['id']}"),
            c.get(f"/v1/responses/{first['id']}/input_items"),
            c.get(f"/v1/responses/{unstored.json()['id']}"),
            c.post(
                "/v1/responses",
                json={"model": MODEL, "input": "x", "previous_response_id": first["id"]},
            ),
        ]
    assert bad_item.status_code == 400 and bad_item.json()["error"]["param"] == "input[0]"
    assert got.status_code == 200 and got.json() == first
    Response.model_validate(got.json())
    # The second response's input is the whole conversation: first's input and output, then its own.
    conversation = [*[i["role"] for i in items], "assistant", "user"]
    assert [i["role"] for i in desc["data"]] == conversation[::-1]
    assert desc["has_more"] is False and desc["object"] == "list"
    assert desc["first_id"] == desc["data"][0]["id"] and desc["last_id"] == desc["data"][-1]["id"]
    for item in desc["data"]:
        ITEM.validate_python(item)
    assert desc["data"][1]["id"] == first["output"][0]["id"]  # the output item, as it was
    assert [i["role"] for i in asc["data"]] == conversation[:2] and asc["has_more"] is True
    assert [i["role"] for i in after["data"]] == conversation[2:] and after["has_more"] is False
    assert bad_after.status_code == bad_limit.status_code == streamed.status_code == 400
    assert deleted.json() == {"id": first["id"], "object": "response.deleted", "deleted": True}
    assert [r.status_code for r in gone] == [404, 404, 404, 404, 400]
    assert gone[0].json()["error"]["type"] == "not_found_error"
    assert gone[-1].json()["error"]["code"] == "previous_response_not_found"
