"""Stored responses in a real index database (migration 0010), held to the same contract as
the in-memory store; what is written survives reopening the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from omlx.adapters.cold_folder import open_cold_folder
from omlx.adapters.sqlindex import (
    SqlResponseStore,
    current_revision,
    index_path,
    open_index,
    upgrade,
)
from omlx.app.settings import Settings
from omlx.app.wiring.bootstrap import _response_store
from omlx.app.wiring.responses_store import MemoryResponseStore
from omlx.domain.responses import DAY, Retention, StoredResponse
from tests.fakes import FakeClock
from tests.storage_checks import assert_cache_invariants

RULE = Retention(max_responses=3, max_age_days=2)


def record(rid: str, at: float) -> StoredResponse:
    response = {"id": rid, "status": "completed", "output": [{"id": f"msg_{rid}", "text": "é ☕"}]}
    return StoredResponse(rid, at, response, [{"id": f"in_{rid}", "content": [{"text": "日本語"}]}])


@pytest.fixture(params=["sql", "memory"])
def store(request, tmp_path: Path) -> Iterator[tuple[object, FakeClock]]:
    clock = FakeClock(100 * DAY)
    if request.param == "memory":
        yield MemoryResponseStore(RULE, clock=clock.now), clock
        return
    index = open_index(tmp_path)
    yield SqlResponseStore(index.engine, RULE, clock=clock.now), clock
    index.close()
    assert_cache_invariants(tmp_path)


def test_the_store_contract(store):
    store, clock = store
    for i in range(5):
        store.put(record(f"r{i}", clock.now() + i))
    assert [store.get(f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert store.get("r3") == record("r3", clock.now() + 3)  # JSON round trip, Unicode kept
    assert store.get("r3").output_items == [{"id": "msg_r3", "text": "é ☕"}]
    store.put(StoredResponse("r3", clock.now() + 3, {"id": "r3", "output": []}))  # replaced
    assert store.get("r3").output_items == [] and store.get("r3").input_items == []
    store.put(record("old", clock.now() - 3 * DAY))  # expired when written: pruned at once
    assert store.get("old") is None
    clock.advance(2 * DAY + 3.5)  # r2 and r3 are now past the age
    assert store.get("r2") is None and store.get("r3") is None and store.get("r4") is not None
    store.put(record("r5", clock.now()))
    assert [store.get(r) is not None for r in ("r4", "r5")] == [True, True]
    assert store.delete("r4") and not store.delete("r4") and store.get("r4") is None
    assert not store.delete("never")


def test_rows_survive_reopening_and_pruning_counts_rows(tmp_path: Path):
    rule, clock = Retention(max_responses=2, max_age_days=1e5), FakeClock(3e9)
    index = open_index(tmp_path)
    store = SqlResponseStore(index.engine, rule, clock=clock.now)
    for i, at in enumerate((3e9, 1e9, 2e9)):  # written out of creation order
        store.put(record(f"r{i}", at))
    index.close()
    index = open_index(tmp_path)
    again = SqlResponseStore(index.engine, rule, clock=clock.now)
    assert again.count() == 2
    assert again.get("r1") is None  # the oldest by created_at went, not the last written
    assert again.get("r0") == record("r0", 3e9) and again.get("r2") == record("r2", 2e9)
    index.close()


def test_migration_0010_adds_the_table_beside_the_index(tmp_path: Path):
    db = index_path(tmp_path)
    upgrade(db, "0003")
    upgrade(db, "0010")
    assert current_revision(db) == "0010"
    with sqlite3.connect(db) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(responses)")]
        indexes = {row[1] for row in conn.execute("PRAGMA index_list(responses)")}
    assert columns == ["id", "created_at", "response", "input_items"]
    assert "ix_responses_created_at" in indexes


def test_the_server_stores_in_the_index_when_the_ssd_tier_is_on(tmp_path: Path):
    folder = open_cold_folder(tmp_path, None)
    try:
        assert isinstance(_response_store(Settings(), folder), SqlResponseStore)
    finally:
        folder.close()
    assert isinstance(_response_store(Settings(), None), MemoryResponseStore)
