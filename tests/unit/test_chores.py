"""A loaded model's start-up chores run while it serves nothing, pause while it does, and stop at unload."""

from __future__ import annotations

import threading
import time

import pytest

from omlx.app.models import chores


class FakeServed:
    id = "m"

    def __init__(self) -> None:
        self.serving = False
        self.closers: list = []

    def busy(self, now: float) -> bool:
        return self.serving

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


@pytest.fixture(autouse=True)
def short_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chores, "_QUIET_BEFORE_CHORES_S", 0.3)


def _wait(event: threading.Event, seconds: float = 5.0) -> bool:
    return event.wait(seconds)


def test_chores_wait_for_a_quiet_spell_and_pause_while_the_model_serves() -> None:
    served = FakeServed()
    served.serving = True
    started, paused, resumed = threading.Event(), threading.Event(), threading.Event()
    steps: list[tuple[str, float]] = []

    def job(proceed) -> None:
        started.set()
        steps.append(("first step", time.monotonic()))
        paused.wait(5)  # the test starts serving here
        assert proceed()  # waits for the next quiet spell
        steps.append(("second step", time.monotonic()))
        resumed.set()

    chores.run_when_quiet(served, [job])
    assert not started.wait(0.8)  # nothing while the model serves
    served.serving = False
    assert _wait(started)
    served.serving = True
    paused.set()
    assert not resumed.wait(0.8)  # the job's next step waits while the model serves
    idle_at = time.monotonic()
    served.serving = False
    assert _wait(resumed)
    assert steps[-1][1] - idle_at >= 0.25  # a whole quiet spell first
    served.close()


def test_an_unload_stops_the_chores_and_waits_for_them() -> None:
    served = FakeServed()
    answers: list[bool] = []
    in_job = threading.Event()

    def job(proceed) -> None:
        in_job.set()
        served.serving = True  # a request arrives mid-job: proceed() would wait
        answers.append(proceed())

    chores.run_when_quiet(served, [job, lambda proceed: answers.append("second job ran")])
    assert _wait(in_job)
    started = time.monotonic()
    served.close()  # the unload: stop, then join
    assert time.monotonic() - started < 2
    assert answers == [False]  # the waiting step said stop; the second job never ran
