"""The domain's surface: it imports only the standard library (STYLE 1); fakes match its ports."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
FORBIDDEN = {
    "mlx",
    "mlx_lm",
    "numpy",
    "sqlalchemy",
    "alembic",
    "litestar",
    "msgspec",
    "safetensors",
}

PROBE = """
import json, sys
before = set(sys.modules)
import omlx.domain
print(json.dumps({"all": sorted(sys.modules), "new": sorted(set(sys.modules) - before)}))
"""


def test_importing_the_domain_loads_only_the_standard_library() -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True
    ).stdout
    modules = json.loads(out)
    top_all = {m.partition(".")[0] for m in modules["all"]}
    assert not top_all & FORBIDDEN
    top_new = {m.partition(".")[0] for m in modules["new"]}
    assert "omlx" in top_new
    assert top_new - {"omlx"} <= set(sys.stdlib_module_names)


PORT_FAKES = [
    ("Clock", "FakeClock"),
    ("KVCodec", "FakeCodec"),
    ("BlockStore", "FakeBlockStore"),
    ("BlockIndex", "FakeBlockIndex"),
    ("ByteBudget", "FakeByteBudget"),
    ("ColdSource", "FakeColdSource"),
    ("BlockSink", "FakeBlockSink"),
    ("KeptCaches", "FakeKeptCaches"),
    ("EvictionPolicy", "LRUPolicy"),
    ("GrammarCompiler", "FakeGrammarCompiler"),
    ("TokenConstraint", "FakeTokenConstraint"),
]


@pytest.mark.parametrize(("port_name", "impl_name"), PORT_FAKES)
def test_fakes_implement_their_ports(port_name: str, impl_name: str) -> None:
    # Protocols are structural: keep the fakes' method names and parameters in step.
    from omlx.domain import ports
    from omlx.domain.cache import eviction
    from omlx.domain.cache import ports as cache_ports
    from tests import fakes

    port = getattr(ports, port_name, None) or getattr(cache_ports, port_name)
    impl = getattr(fakes, impl_name, None) or getattr(eviction, impl_name)
    for name, member in vars(port).items():
        if name.startswith("_") or not callable(member):
            continue
        assert callable(getattr(impl, name, None)), f"{impl_name} lacks {name}"
        want = list(inspect.signature(member).parameters)
        assert list(inspect.signature(getattr(impl, name)).parameters) == want, name


def _port_members(port: type) -> tuple[dict[str, object], set[str]]:
    """A port's methods (its own and its bases') and its data members (attributes, properties)."""
    from omlx.domain import ports

    methods: dict[str, object] = {}
    data: set[str] = set()
    for klass in reversed(port.__mro__):
        if klass.__module__ != ports.__name__:
            continue
        data |= {n for n in vars(klass).get("__annotations__", {}) if not n.startswith("_")}
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property):
                data.add(name)
            elif callable(member):
                methods[name] = member
    return methods, data


ENGINE_FAKES = [
    ("GenerationEngine", "FakeEngine"),
    ("ModelWorker", "FakeEngine"),
    ("ChatModel", "FakeModel"),
]


@pytest.mark.parametrize(("port_name", "impl_name"), ENGINE_FAKES)
def test_the_api_fakes_implement_the_engine_ports(port_name: str, impl_name: str) -> None:
    # What the app's services are tested over must be what the MLX adapter has to provide.
    from omlx.domain import ports
    from tests.unit import api_fakes

    port, impl = getattr(ports, port_name), getattr(api_fakes, impl_name)
    methods, data = _port_members(port)
    assert methods or data
    fake = impl()
    for name, member in methods.items():
        assert callable(getattr(impl, name, None)), f"{impl_name} lacks {name}"
        want = list(inspect.signature(member).parameters)
        assert list(inspect.signature(getattr(impl, name)).parameters) == want, name
    for name in data:
        assert hasattr(fake, name), f"{impl_name} lacks {name}"
