"""``/health``'s ``waiting_for``: the start-up steps under way, oldest first, with their seconds."""

from __future__ import annotations

from omlx.domain.startup import StartupSteps


def test_steps_under_way_are_listed_oldest_first_with_their_seconds():
    now = [10.0]
    steps = StartupSteps(clock=lambda: now[0])
    outer = steps.begin("starting the HTTP server")
    now[0] = 10.5
    with steps.step("opening the cache"):
        now[0] = 11.25
        assert steps.waiting_for() == [
            "starting the HTTP server (1.2 s)",
            "opening the cache (0.8 s)",
        ]
    assert steps.waiting_for() == ["starting the HTTP server (1.2 s)"]
    steps.end(outer)
    assert steps.waiting_for() == []


def test_a_step_that_fails_is_no_longer_waited_for():
    steps = StartupSteps()
    try:
        with steps.step("loading m"):
            raise RuntimeError("weights missing")
    except RuntimeError:
        pass
    assert steps.waiting_for() == []
