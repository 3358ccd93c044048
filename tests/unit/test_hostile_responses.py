"""Responses store under hostile use (issue 22 rows 5, 6, 7): metadata limits, chains stored
as links, and a store that cannot be used named in a 503 or a ``store: false``."""

from __future__ import annotations

import pytest
from litestar.testing import TestClient

from omlx.app.api.app import create_app
from omlx.domain.cache.ports import IndexUnavailable
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container, reply


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ({f"k{i}": "v" for i in range(16)}, True),
        ({f"k{i}": "v" for i in range(17)}, False),
        ({"k" * 64: "v" * 512}, True),
        ({"k" * 65: "v"}, False),
        ({"k": "v" * 513}, False),
        ({"k": "v" * 3_600_000}, False),
    ],
    ids=["16-pairs", "17-pairs", "at-limits", "long-key", "long-value", "3.6MB"],
)
def test_metadata_follows_openais_limits(metadata, ok):
    container = fake_container()
    with TestClient(create_app(container)) as c:
        r = c.post("/v1/responses", json={"model": MODEL, "input": "hi", "metadata": metadata})
    if ok:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == "metadata", r.text
        assert len(container.responses) == 0


def test_a_six_turn_chain_stores_each_turn_once():
    container = fake_container(FakeEngine(reply("answer " * 20)))
    with TestClient(create_app(container)) as c:
        previous, ids = None, []
        for i in range(6):
            body = {"model": MODEL, "input": f"question {i} " * 20}
            if previous:
                body["previous_response_id"] = previous
            r = c.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
            previous = r.json()["id"]
            ids.append(previous)
        listed = c.get(f"/v1/responses/{ids[-1]}/input_items?order=asc&limit=100").json()
    records = [container.responses.get(i) for i in ids]
    assert [len(r.input_items) for r in records] == [1] * 6  # each its own turn
    assert [r.previous_id for r in records] == [None, *ids[:-1]]
    sizes = [r.nbytes for r in records]
    assert max(sizes) < 1.2 * min(sizes), sizes  # linear: the sixth costs what the first did
    assert len(listed["data"]) == 11  # five turns in and out, then its own input


class DownStore:
    """A store whose database cannot be reached."""

    def __getattr__(self, name):
        def call(*args):
            raise IndexUnavailable("index postgresql://db/omlx unreachable: connection refused")

        return call


def test_a_store_that_cannot_be_reached_is_a_503_naming_it_and_never_a_dangling_id():
    container = fake_container()
    container.responses = DownStore()
    with TestClient(create_app(container)) as c:
        created = c.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        got = c.get("/v1/responses/resp_1")
        deleted = c.delete("/v1/responses/resp_1")
        items = c.get("/v1/responses/resp_1/input_items")
        follow = c.post(
            "/v1/responses", json={"model": MODEL, "input": "hi", "previous_response_id": "resp_1"}
        )
    assert created.status_code == 200 and created.json()["store"] is False  # said: not stored
    for r in (got, deleted, items, follow):
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert (
            error["code"] == "store_unavailable"
            and "postgresql://db/omlx unreachable" in error["message"]
        )


def test_a_stream_whose_store_fails_says_store_false_in_its_last_event():
    container = fake_container()
    container.responses = DownStore()
    body = {"model": MODEL, "input": "hi", "stream": True}
    with TestClient(create_app(container)) as c, c.stream("POST", "/v1/responses", json=body) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    import json

    last = json.loads(lines[-1].removeprefix("data:"))
    assert last["type"] == "response.completed" and last["response"]["store"] is False
