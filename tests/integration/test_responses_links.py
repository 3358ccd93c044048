"""Stored responses as links (issue 22 rows 5, 6): linear storage, whole chains after
pruning and deleting, a byte budget, migration 0012, and a PostgreSQL outage named."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from omlx.adapters.sqlindex import (
    SqlResponseStore,
    connect_index,
    index_path,
    make_engine,
    open_index,
    upgrade,
)
from omlx.app.wiring.responses_store import MemoryResponseStore
from omlx.domain.cache.ports import IndexUnavailable
from omlx.domain.responses import (
    DAY,
    Retention,
    StoredResponse,
    TooLargeToStore,
    conversation_input,
    history,
)
from tests.fakes import FakeClock
from tests.postgres import PostgresServer, find_bindir


def turn(i: int, at: float, previous: str | None) -> StoredResponse:
    response = {"id": f"r{i}", "output": [{"id": f"out{i}", "text": f"answer {i} " * 20}]}
    return StoredResponse(
        f"r{i}", at, response, [{"id": f"in{i}", "text": f"question {i} " * 20}], previous
    )


def whole(n: int) -> list[dict]:
    items = []
    for i in range(n):
        items += [
            {"id": f"in{i}", "text": f"question {i} " * 20},
            {"id": f"out{i}", "text": f"answer {i} " * 20},
        ]
    return items


def make(kind: str, tmp_path: Path, rule: Retention, clock: FakeClock):
    if kind == "memory":
        return MemoryResponseStore(rule, clock=clock.now), None
    index = open_index(tmp_path)
    return SqlResponseStore(index.engine, rule, clock=clock.now), index


@pytest.fixture(params=["sql", "memory"])
def kind(request) -> str:
    return request.param


def test_a_chain_is_stored_as_links_and_read_back_whole(kind, tmp_path):
    clock = FakeClock(100 * DAY)
    store, index = make(kind, tmp_path, Retention(max_responses=100), clock)
    sizes = []
    for i in range(6):
        store.put(turn(i, clock.now() + i, f"r{i - 1}" if i else None))
        sizes.append(store.get(f"r{i}").nbytes)
    chain = store.chain("r5")
    assert [r.id for r in chain] == [f"r{i}" for i in range(6)]
    assert history(chain) == whole(6)
    assert conversation_input(chain) == whole(6)[:-1]
    assert max(sizes) - min(sizes) < 20, sizes  # each link its own turn: linear, not quadratic
    assert store.chain("nope") is None
    if index is not None:
        index.close()


def test_pruning_and_deleting_fold_items_into_the_followers(kind, tmp_path):
    clock = FakeClock(100 * DAY)
    store, index = make(kind, tmp_path, Retention(max_responses=3), clock)
    for i in range(5):
        store.put(turn(i, clock.now() + i, f"r{i - 1}" if i else None))
    assert store.get("r0") is None and store.get("r1") is None  # pruned by count
    assert history(store.chain("r4")) == whole(5)  # their items live on in r2
    assert store.delete("r3")  # a middle link deleted
    assert [r.id for r in store.chain("r4")] == ["r2", "r4"]
    assert history(store.chain("r4")) == whole(5)
    if index is not None:
        index.close()


def test_the_store_keeps_inside_its_byte_budget(kind, tmp_path):
    clock = FakeClock(100 * DAY)
    size = turn(0, 0, None).nbytes
    store, index = make(kind, tmp_path, Retention(max_responses=1000, max_bytes=size * 4), clock)
    for i in range(10):
        store.put(turn(i, clock.now() + i, None))
    total = store.total_bytes()
    assert total <= size * 4 + 40, total
    assert store.get("r9") is not None and store.get("r0") is None
    big = StoredResponse("big", clock.now() + 20, {"id": "big", "output": [{"t": "x" * size * 5}]})
    with pytest.raises(TooLargeToStore):
        store.put(big)
    assert store.get("big") is None
    if index is not None:
        index.close()


def test_migration_0012_keeps_rows_written_before_as_whole_chains(tmp_path):
    db = index_path(tmp_path)
    upgrade(db, "0011")
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO responses (id, created_at, response, input_items) VALUES (?, ?, ?, ?)",
            (
                "old",
                time.time(),
                '{"id": "old", "output": [{"id": "o"}]}',
                '[{"id": "a"}, {"id": "b"}]',
            ),
        )
    upgrade(db)
    with sqlite3.connect(db) as conn:
        nbytes, previous = conn.execute("SELECT nbytes, previous_id FROM responses").fetchone()
    assert nbytes > 0 and previous is None
    store = SqlResponseStore(make_engine(db), Retention())
    assert history(store.chain("old")) == [{"id": "a"}, {"id": "b"}, {"id": "o"}]


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own: it is stopped and started again."""
    bindir, why = find_bindir()
    if bindir is None:
        pytest.skip(why)
    server = PostgresServer(bindir)
    try:
        server.start()
    except (RuntimeError, OSError) as exc:
        server.close()
        pytest.skip(f"PostgreSQL could not start here: {exc}")
    yield server
    server.close()


def test_a_postgresql_outage_is_named_and_nothing_stored_is_lost(own_postgres):
    index = connect_index(own_postgres.create_database())
    store = SqlResponseStore(index.engine, Retention())
    store.put(turn(0, time.time(), None))
    own_postgres.stop()
    for call in (
        lambda: store.get("r0"),
        lambda: store.chain("r0"),
        lambda: store.delete("r0"),
        lambda: store.put(turn(1, time.time(), "r0")),
    ):
        started = time.monotonic()
        with pytest.raises(IndexUnavailable, match="unreachable"):
            call()
        assert time.monotonic() - started < 5
    own_postgres.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            assert store.get("r0") == turn(0, store.get("r0").created_at, None)
            break
        except IndexUnavailable:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    store.put(turn(1, time.time(), "r0"))
    assert history(store.chain("r1")) == whole(2)
    index.close()
