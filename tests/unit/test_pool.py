"""The model pool over a fake loader: on demand, one load at a time, LRU under a limit, pins."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from omlx.app.errors import Busy, InvalidRequest, NotFound
from omlx.app.models.catalog import ModelSpec
from omlx.app.models.model_names import ModelNames
from omlx.app.models.pool import ModelPool, Served
from omlx.domain.memory import MemoryAccount
from tests.fakes import FakeClock

GB = 10**9


class Engine:
    def __init__(self) -> None:
        self.active = self.queued = 0
        self.last_submitted = 0.0
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


class Loader:
    """Makes a Served of the spec's size; slow enough that concurrent requests overlap."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.loads: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, spec: ModelSpec) -> Served:
        self.gate.wait(5)
        self.loads.append(spec.id)
        engine = Engine()
        served = Served(spec, model=object(), engine=engine, weights=self.sizes[spec.id])
        served.closers.append(engine.stop)
        return served


def pool_of(
    sizes: dict[str, int], limit: int | None = None, **kwargs
) -> tuple[ModelPool, Loader, FakeClock]:
    specs = [ModelSpec(m, Path(f"/models/{m}"), kwargs.pop(f"task_{m}", "chat")) for m in sizes]
    loader, clock = Loader(sizes), FakeClock()
    pool = ModelPool(
        specs,
        ModelNames(list(sizes), ["small-alias=small"] if "small" in sizes else []),
        load=loader,
        estimate=lambda spec: sizes[spec.id],
        account=MemoryAccount(limit),
        clock=clock.now,
        **kwargs,
    )
    return pool, loader, clock


def run(coro):
    return asyncio.run(coro)


def test_a_model_loads_on_its_first_request_and_stays():
    pool, loader, _ = pool_of({"big": 4 * GB, "small": GB})
    assert pool.state("small") == "available"
    served = run(pool.acquire("small-alias"))
    assert served.id == "small" and pool.state("small") == "loaded"
    run(pool.acquire("small"))
    assert loader.loads == ["small"]
    with pytest.raises(NotFound):
        run(pool.acquire("nope"))


def test_concurrent_first_requests_wait_for_one_load():
    pool, loader, _ = pool_of({"big": 4 * GB})
    loader.gate.clear()

    async def many():
        tasks = [asyncio.create_task(pool.acquire("big")) for _ in range(5)]
        await asyncio.sleep(0.05)
        assert pool.state("big") == "loading"
        loader.gate.set()
        return await asyncio.gather(*tasks)

    served = run(many())
    assert loader.loads == ["big"] and len({id(s) for s in served}) == 1


def test_past_the_limit_the_least_recently_used_idle_model_goes_first():
    pool, _, clock = pool_of({"a": 3 * GB, "b": 3 * GB, "c": 3 * GB}, limit=7 * GB)
    a = run(pool.acquire("a"))
    clock.advance(10)
    run(pool.acquire("b"))
    clock.advance(10)
    run(pool.acquire("a"))  # a is now the more recent
    clock.advance(10)
    run(pool.acquire("c"))
    assert pool.state("b") == "available" and pool.state("a") == "loaded"
    assert pool.account.held() == 6 * GB
    assert not a.engine.stopped


def test_a_model_in_use_or_pinned_is_never_unloaded():
    pool, _, clock = pool_of({"a": 3 * GB, "b": 3 * GB, "c": 3 * GB}, limit=7 * GB, pinned=["a"])
    run(pool.acquire("a"))
    b = run(pool.acquire("b"))
    clock.advance(10)
    b.engine.active = 1  # a request is running on b
    pool.room_wait = 0
    with pytest.raises(Busy, match="retry"):
        run(pool.acquire("c"))
    assert pool.state("a") == pool.state("b") == "loaded"
    b.engine.active = 0
    run(pool.acquire("c"))
    assert pool.state("b") == "available" and pool.state("a") == "loaded"
    assert not pool.unload("a")  # pinned


def test_a_load_waits_for_a_busy_model_to_go_idle():
    pool, _, clock = pool_of({"a": 3 * GB, "b": 3 * GB}, limit=4 * GB)
    a = run(pool.acquire("a"))
    clock.advance(10)
    a.engine.active = 1

    async def scenario():
        load_b = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0.5)
        assert not load_b.done() and pool.state("a") == "loaded"  # queued behind a's request
        a.engine.active = 0
        return await asyncio.wait_for(load_b, 5)

    assert run(scenario()).id == "b" and pool.state("a") == "available"


def test_a_model_is_in_use_from_its_choice_until_its_request_reaches_the_engine():
    pool, _, clock = pool_of({"a": 3 * GB, "b": 3 * GB}, limit=4 * GB)
    pool.room_wait = 0
    a = run(pool.acquire("a"))
    with pytest.raises(Busy):  # chosen, not submitted yet: rendering or tokenizing
        run(pool.acquire("b"))
    a.engine.last_submitted = clock.now()  # submitted and already finished
    run(pool.acquire("b"))
    assert pool.state("a") == "available"


def test_a_load_that_only_pinned_models_block_fails_at_once():
    pool, _, _ = pool_of({"a": 3 * GB, "b": 3 * GB}, limit=4 * GB, pinned=["a"])
    run(pool.acquire("a"))
    with pytest.raises(Busy, match="max_model_memory"):
        run(asyncio.wait_for(pool.acquire("b"), 2))  # no waiting: a pin never goes idle


def test_a_model_that_cannot_fit_alone_is_a_clear_error():
    pool, loader, _ = pool_of({"huge": 20 * GB}, limit=16 * GB)
    with pytest.raises(InvalidRequest, match="max_model_memory") as err:
        run(pool.acquire("huge"))
    assert "/models/huge" in err.value.message and loader.loads == []


def test_idle_models_are_unloaded_after_the_timeout_and_the_wrong_task_is_refused():
    pool, _, clock = pool_of({"a": GB, "e": GB}, idle_timeout=60, task_e="embedding")
    run(pool.acquire("a"))
    clock.advance(30)
    assert pool.unload_idle() == []
    clock.advance(31)
    assert pool.unload_idle() == ["a"] and pool.state("a") == "available"
    with pytest.raises(InvalidRequest, match="embedding model"):
        run(pool.acquire("e"))
    assert run(pool.acquire("e", "embedding")).id == "e"
    with pytest.raises(ValueError, match="no such model"):
        pool_of({"a": GB}, pinned=["zz"])
