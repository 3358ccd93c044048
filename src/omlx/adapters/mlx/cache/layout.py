"""What a model's mlx-lm cache is made of, and whether omlx can keep it.

Each entry ``make_cache()`` returns is walked (``CacheList`` into its children) to its
*leaves*, each of one kind the block cache knows how to keep:

- ``KVCache`` → ``kv``: per-block KV of a full-attention layer;
- ``RotatingKVCache(W, keep=0)`` → ``window``: a sliding-window layer, whose restore
  needs the last ``W`` positions' KV;
- ``ArraysCache`` → ``state``: SSM / linear-attention state, kept as snapshots.

Classes mlx-lm cannot batch (``QuantizedKVCache``, ``ChunkedKVCache``, ``keep > 0``) and
families it computes wrongly in batched prefill keep the cache off, with the reason.
The layout's *signature* (class and shapes per leaf) enters the namespace digest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import mlx.core as mx
import mlx_lm
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache, make_prompt_cache

from omlx.adapters.mlx.cache.memory import KVCost, kv_cost_of
from omlx.domain.cache.keys import KV, STATE, WINDOW
from omlx.domain.cache.layout import CacheLayout

T = TypeVar("T")

# Families whose batched prefill mlx-lm gets wrong: a request's cache would be wrong
# whether or not omlx restores it, and a restore would spread the error. Each entry
# says why; tests/integration/test_hybrid_cache.py turns red when mlx-lm is fixed.
BROKEN_FAMILIES = {
    "nemotron_h": (
        "mlx-lm 0.32 computes its Mamba2 state wrongly for right-padded rows in a batched "
        "prefill (NemotronHMamba2Mixer calls ssm_update without lengths)"
    ),
}


@dataclass(frozen=True, slots=True)
class Leaf:
    path: tuple[int, ...]  # index in the cache list, then in CacheList children
    kind: str  # kv | window | state
    window: int | None = None
    slots: int = 0  # arrays of a state leaf


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """The leaves of a model's cache, how they nest, and the namespace signature."""

    leaves: tuple[Leaf, ...]
    shape: tuple[Any, ...]  # per top-level entry: a leaf index, or a tuple of them (CacheList)
    signature: tuple[str, ...]
    unsupported: str = ""  # why the cache is off, if it is

    @property
    def domain(self) -> CacheLayout:
        windows = [leaf.window for leaf in self.leaves if leaf.kind == WINDOW]
        return CacheLayout(
            window=max(windows) if windows else None,
            has_state=any(leaf.kind == STATE for leaf in self.leaves),
        )

    def counts(self) -> dict[str, int]:
        """How many leaves of each kind ("kv", "window 32", "state"), for logs and /health."""
        out: dict[str, int] = {}
        for leaf in self.leaves:
            label = f"window {leaf.window}" if leaf.window else leaf.kind
            out[label] = out.get(label, 0) + 1
        return out

    def of(self, kind: str) -> list[int]:
        """Indices of the leaves of ``kind``."""
        return [i for i, leaf in enumerate(self.leaves) if leaf.kind == kind]


def plain_layout(layers: int) -> ModelLayout:
    """A model of ``layers`` full-attention layers."""
    return ModelLayout(
        tuple(Leaf((i,), KV) for i in range(layers)), tuple(range(layers)), ("kv",) * layers
    )


def _kv(entry: KVCache, path: tuple[int, ...]) -> tuple[Leaf, str, str]:
    return Leaf(path, KV), "kv", ""


def _window(entry: RotatingKVCache, path: tuple[int, ...]) -> tuple[Leaf, str, str]:
    problem = (
        f"a sliding-window layer keeps {entry.keep} positions (keep > 0 cannot be batched)"
        if entry.keep
        else ""
    )
    return Leaf(path, WINDOW, window=entry.max_size), f"swa:{entry.max_size}", problem


def _state(entry: ArraysCache, path: tuple[int, ...]) -> tuple[Leaf, str, str]:
    arrays = [
        "none" if a is None else f"{list(a.shape[1:])}:{str(a.dtype).removeprefix('mlx.core.')}"
        for a in entry.cache
    ]
    signature = f"state:{len(entry.cache)}:[{','.join(arrays)}]"
    return Leaf(path, STATE, slots=len(entry.cache)), signature, ""


# What each mlx-lm cache class is to the block cache: the registry the codec's leaves come
# from (exact classes: a subclass may keep its state otherwise). CacheList is walked into.
LEAF_KINDS: dict[type, Callable[[Any, tuple[int, ...]], tuple[Leaf, str, str]]] = {
    KVCache: _kv,
    RotatingKVCache: _window,
    ArraysCache: _state,
}


@dataclass(frozen=True, slots=True)
class ModelProbe:
    """What one forward pass of one token tells about a model's cache."""

    layout: ModelLayout
    kv_dtype: str  # of the first KV buffer ("unknown" without one)
    kv_cost: KVCost  # what one request's cache costs (the memory guard's measure)


def probe_model(model: Any) -> ModelProbe:
    """Run one token through a fresh cache (so state shapes and dtypes are known) and read it.

    The one probe at load: the layout, the KV dtype and the KV cost all come from it.
    """
    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    mx.eval([getattr(c, "state", []) for c in cache])
    leaves = flat_leaves(cache)
    return ModelProbe(_layout_of(model, cache), _kv_dtype(leaves), kv_cost_of(leaves))


def _layout_of(model: Any, cache: list[Any]) -> ModelLayout:
    leaves: list[Leaf] = []
    signatures: list[str] = []  # per leaf
    problems: list[str] = []

    def describe(entry: Any, path: tuple[int, ...]) -> int:
        kind_of = LEAF_KINDS.get(type(entry))
        if kind_of is None:
            problems.append(f"its {type(entry).__name__} layers cannot be batched by mlx-lm")
            leaf, signature = Leaf(path, "unsupported"), type(entry).__name__
        else:
            leaf, signature, problem = kind_of(entry, path)
            if problem:
                problems.append(problem)
        leaves.append(leaf)
        signatures.append(signature)
        return len(leaves) - 1

    shape = map_leaves(cache, describe)
    signature = [_signature(node, signatures) for node in shape]
    args = getattr(model, "args", None)
    family = getattr(args, "model_type", None) or getattr(model, "model_type", None)
    if family in BROKEN_FAMILIES:
        problems.append(BROKEN_FAMILIES[family])
    if any(leaf.kind == STATE for leaf in leaves):
        # State snapshots depend on how mlx-lm computes the recurrence: key on its version.
        signature.append(f"mlx_lm:{mlx_lm.__version__}")
    return ModelLayout(
        tuple(leaves), tuple(shape), tuple(signature), "; ".join(dict.fromkeys(problems))
    )


def _kv_dtype(leaves: list[Any]) -> str:
    for layer in leaves:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, mx.array):
            return str(keys.dtype).removeprefix("mlx.core.")
    return "unknown"


# ---- the cache tree ----------------------------------------------------------------


def map_leaves(cache: list[Any], fn: Callable[[Any, tuple[int, ...]], T]) -> list[Any]:
    """The cache with each leaf replaced by ``fn(leaf, path)``; a ``CacheList`` becomes a
    tuple of its children's results (the one walk over mlx-lm's cache trees)."""

    def visit(entry: Any, path: tuple[int, ...]) -> Any:
        if isinstance(entry, CacheList):
            return tuple(visit(child, (*path, j)) for j, child in enumerate(entry.caches))
        return fn(entry, path)

    return [visit(entry, (i,)) for i, entry in enumerate(cache)]


def flat_leaves(cache: list[Any]) -> list[Any]:
    """The leaf caches of a cache, in order (``CacheList`` entries walked into)."""
    out: list[Any] = []
    map_leaves(cache, lambda leaf, _: out.append(leaf))
    return out


def _signature(node: int | tuple, signatures: list[str]) -> str:
    if isinstance(node, tuple):
        return "list(" + ",".join(_signature(n, signatures) for n in node) + ")"
    return signatures[node]
