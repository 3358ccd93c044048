"""A caller's per-layer entries (``kv_data``): checked, made compact, and to and from block tensors.

An entry is one layer's arrays: a ``(keys, values)`` pair, or what an mlx-lm cache's
``state`` returns (``KVCache``: ``(keys, values, offset)``; ``ArraysCache``: its list of
arrays with ``None`` for empty slots, then ``left_padding`` and ``lengths``; a
``CacheList``: each cache's state with its class name). So an entry is a tree of MLX
arrays, ``None``, ints and strings in tuples and lists, and comes back as the same tree. Everything here runs on the
caller's thread: the writer thread only ever gets the bytes ``to_tensors`` leads to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import numpy as np

from omlx.adapters.blockfiles.format import MAX_LAYER_DEPTH, RawTensor

# MLX dtype -> (safetensors name, numpy dtype of the host view); bf16 travels as its bits.
_TO_ST: dict[Any, tuple[str, Any]] = {
    mx.bool_: ("BOOL", np.bool_),
    mx.uint8: ("U8", np.uint8),
    mx.uint16: ("U16", np.uint16),
    mx.uint32: ("U32", np.uint32),
    mx.uint64: ("U64", np.uint64),
    mx.int8: ("I8", np.int8),
    mx.int16: ("I16", np.int16),
    mx.int32: ("I32", np.int32),
    mx.int64: ("I64", np.int64),
    mx.float16: ("F16", np.float16),
    mx.bfloat16: ("BF16", np.uint16),
    mx.float32: ("F32", np.float32),
    mx.float64: ("F64", np.float64),
}
_FROM_ST = {name: (np_dtype, dtype) for dtype, (name, np_dtype) in _TO_ST.items()}
SUPPORTED_DTYPES = tuple(str(d).removeprefix("mlx.core.") for d in _TO_ST)


def checked(kv_data: Any) -> list[Any]:
    """``kv_data`` as a list of entries, every one checked; nothing is evaluated yet.

    Raises ``TypeError`` or ``ValueError`` naming the first entry that cannot be stored.
    """
    if not isinstance(kv_data, list | tuple):
        raise TypeError(
            f"kv_data must be a list of per-layer entries, got a {type(kv_data).__name__}"
        )
    if not kv_data:
        raise ValueError("kv_data holds no layers")
    for i, entry in enumerate(kv_data):
        where = f"kv_data[{i}]"
        if not isinstance(entry, list | tuple):
            raise TypeError(
                f"{where}: a layer's entry is a (keys, values) tuple or a cache's state "
                f"(a tuple or list of arrays), got {_describe(entry)}"
            )
        _check(entry, where, 0)
    return list(kv_data)


def _check(value: Any, where: str, depth: int) -> None:
    if depth > MAX_LAYER_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_LAYER_DEPTH} levels")
    if isinstance(value, mx.array):
        if value.dtype not in _TO_ST:
            raise ValueError(
                f"{where}: dtype {value.dtype} cannot be stored "
                f"(supported: {', '.join(SUPPORTED_DTYPES)})"
            )
    elif isinstance(value, list | tuple):
        for j, item in enumerate(value):
            _check(item, f"{where}[{j}]", depth + 1)
    elif not (
        value is None
        or isinstance(value, str)
        or (isinstance(value, int) and not isinstance(value, bool))
    ):
        raise TypeError(
            f"{where}: {_describe(value)} cannot be stored in a block "
            "(entries hold MLX arrays, None, ints and strings, in tuples and lists)"
        )


def _describe(value: Any) -> str:
    """The value's type, with the likely fix for the usual mistakes."""
    if isinstance(value, np.ndarray):
        return "a numpy array (wrap it in mx.array)"
    if hasattr(value, "state") and type(value).__module__.startswith("mlx_lm."):
        return f"an mlx-lm {type(value).__name__} (pass its .state)"
    return f"a {type(value).__name__}"


def compact(layers: list[Any]) -> tuple[list[Any], int]:
    """Evaluated, row-contiguous copies of the entries' arrays, and their bytes.

    A slice of a larger buffer (a block cut from a whole cache) is copied, so the RAM
    tier's budget counts what it keeps alive; a whole array is shared, not copied. The
    copies are new array objects either way: the caller writing into its arrays later
    (``a[...] = b``) does not reach them.
    """
    out = _map(layers, mx.contiguous)
    arrays = list(_arrays(out))
    mx.eval(arrays)
    return out, sum(a.nbytes for a in arrays)


def shared(layers: list[Any]) -> list[Any]:
    """The entries as new trees of new array objects over the same buffers (a RAM hit)."""
    return _map(layers, lambda a: a[...])


def to_tensors(layers: list[Any]) -> list[Any]:
    """The entries with each (evaluated) array as a ``RawTensor``: zero-copy host views."""
    return _map(layers, _tensor_of)


def from_tensors(layers: list[Any]) -> list[Any]:
    """Entries read back from a block file: each ``RawTensor`` copied once into MLX."""
    out = _map(layers, _array_of, leaf=RawTensor)
    mx.eval(list(_arrays(out)))
    return out


def _tensor_of(array: mx.array) -> RawTensor:
    name = _TO_ST[array.dtype][0]
    bits = array.view(mx.uint16) if array.dtype == mx.bfloat16 else array
    host = np.asarray(bits)  # a view of the evaluated MLX buffer
    if not host.flags.c_contiguous:  # (ascontiguousarray would make a scalar 1-D)
        host = host.copy(order="C")
    # As flat bytes, which any shape (a scalar, an empty array) has.
    return RawTensor(name, tuple(array.shape), memoryview(host.reshape(-1).view(np.uint8)))


def _array_of(tensor: RawTensor) -> mx.array:
    try:
        np_dtype, dtype = _FROM_ST[tensor.dtype]
    except KeyError:
        raise ValueError(f"dtype {tensor.dtype} is not an MLX dtype") from None
    host = np.frombuffer(tensor.data, np_dtype).reshape(tensor.shape)
    if dtype == mx.bfloat16:
        return mx.array(host).view(mx.bfloat16)
    return mx.array(host, dtype=dtype)


def _map(value: Any, fn: Callable[[Any], Any], leaf: type = mx.array) -> Any:
    """``value`` rebuilt with ``fn`` applied to every ``leaf``; tuples stay tuples."""
    if isinstance(value, leaf):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map(v, fn, leaf) for v in value)
    if isinstance(value, list):
        return [_map(v, fn, leaf) for v in value]
    return value


def _arrays(value: Any) -> Iterator[mx.array]:
    if isinstance(value, mx.array):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _arrays(item)
