"""The MLX adapter provides what the app's services are written against: the engine ports."""

from __future__ import annotations

import inspect
import threading
import time

import pytest

from omlx.adapters.mlx.batch.engine import EngineConfig, MLXEngine
from omlx.adapters.mlx.models.loader import load_model
from omlx.adapters.mlx.models.runner import MLXRunner
from omlx.domain import ports
from tests.unit.test_domain_imports import _port_members


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def _assert_implements(port: type, impl: object) -> None:
    methods, data = _port_members(port)
    for name, member in methods.items():
        want = list(inspect.signature(member).parameters)[1:]  # the bound method has no self
        assert list(inspect.signature(getattr(impl, name)).parameters) == want, name
    for name in data:
        assert hasattr(impl, name), f"{type(impl).__name__} lacks {name}"


def test_the_engine_the_runner_and_the_loaded_model_implement_their_ports(tiny) -> None:
    engine = MLXEngine(tiny, None, EngineConfig(max_concurrent=1))  # not started: no thread
    _assert_implements(ports.GenerationEngine, engine)
    assert (engine.active, engine.queued, engine.last_submitted) == (0, 0, 0.0)
    runner = MLXRunner("ports")
    _assert_implements(ports.ModelWorker, runner)
    _assert_implements(ports.ChatModel, tiny)
    assert tiny.layout is not None and sum(tiny.layout.counts().values()) == tiny.layer_count


def test_the_runner_counts_running_and_waiting_calls_apart() -> None:
    runner = MLXRunner("counts").start()
    gate, started = threading.Event(), threading.Event()

    def held() -> int:
        started.set()
        gate.wait(5)
        return 1

    try:
        first, second = runner.submit(held), runner.submit(lambda: 2)
        assert started.wait(5)
        assert (runner.active, runner.queued) == (1, 1) and runner.last_submitted > 0
        gate.set()
        assert (first.result(5), second.result(5)) == (1, 2)
        deadline = time.monotonic() + 5  # the count drops just after the result is set
        while runner.active and time.monotonic() < deadline:
            time.sleep(0.001)
        assert (runner.active, runner.queued) == (0, 0)
    finally:
        gate.set()
        runner.stop()
