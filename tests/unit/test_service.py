"""The generation service's bridge: keepalives, cancellation on leaving, disconnect watching."""

from __future__ import annotations

import asyncio
import threading

import pytest

from omlx.app.api.disconnect import unless_disconnected
from omlx.app.chat.sampling import Sampling
from omlx.app.chat.service import GenerationService
from omlx.app.errors import ClientGone
from omlx.domain.generation import Finished, PrefillStarted, TextDelta
from tests.unit.api_fakes import FakeEngine, FakeModel


class LateEngine(FakeEngine):
    """Emits from another thread after ``delay`` seconds, like the engine after a long prefill."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def submit(self, request, emit):
        self.submitted.append(request)
        events = [PrefillStarted(0, 3), TextDelta("x"), Finished("stop", 3, 1, 0)]
        self.timer = threading.Timer(self.delay, lambda: [emit(e) for e in events])
        self.timer.start()
        return len(self.submitted)

    def cancel(self, job_id):
        super().cancel(job_id)
        self.timer.cancel()


class Observer:
    def __init__(self) -> None:
        self.first, self.done, self.left = [], [], 0

    def first_token(self, seconds):
        self.first.append(seconds)

    def finished(self, event):
        self.done.append(event)

    def cancelled(self):
        self.left += 1

    def completed(self, event, ttft_s, decode_s):
        pass


def service(engine: FakeEngine) -> GenerationService:
    observer = Observer()
    return GenerationService(
        engine, FakeModel(), max_queued=4, default_max_tokens=8, observer=observer
    )


def request(svc: GenerationService):
    return svc.build_request([1, 2, 3], Sampling(max_tokens=4, temperature=0, seed=-1))


def test_quiet_spells_yield_keepalives_and_lose_no_event():
    svc = service(LateEngine(0.3))

    async def run():
        return [e async for e in svc.events(request(svc), keepalive=0.05)]

    events = asyncio.run(run())
    assert None in events
    assert [type(e) for e in events if e is not None] == [PrefillStarted, TextDelta, Finished]
    assert len(svc.observer.first) == 1 and len(svc.observer.done) == 1


def test_leaving_early_cancels_the_request():
    engine = LateEngine(10.0)
    svc = service(engine)

    async def run():
        events = svc.events(request(svc), keepalive=0.01)
        assert await events.__anext__() is None
        await events.aclose()

    asyncio.run(run())
    assert engine.cancelled == [1]
    assert svc.observer.left == 1


def test_a_disconnect_cancels_the_work():
    cancelled = asyncio.Event()

    async def work():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def receive():
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def run():
        with pytest.raises(ClientGone):
            await unless_disconnected(receive, work())
        await asyncio.wait_for(cancelled.wait(), 1)

    asyncio.run(run())


def test_work_that_finishes_first_is_returned():
    async def receive():
        await asyncio.sleep(10)

    async def work():
        return 42

    assert asyncio.run(unless_disconnected(receive, work())) == 42


def test_seeds_are_taken_modulo_2_64():
    svc = service(FakeEngine())
    assert request(svc).sampling.seed == 2**64 - 1
