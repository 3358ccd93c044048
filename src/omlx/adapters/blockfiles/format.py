"""The block file format (DESIGN §4): plain safetensors, written and parsed without numpy.

Layout: 8-byte little-endian header length, a JSON header (``dtype``, ``shape``,
``data_offsets`` per tensor and string ``__metadata__``) padded with spaces to an
8-byte boundary, then the tensors' bytes back to back. Any safetensors reader loads it.
Block files put ``tokens`` first, then every ``k.<i>``, then every ``v.<i>``, so each
side's layers are one span a reader can take whole (``joined``); readers accept any order.
A quantized block (``kv_bits`` metadata) holds codes (U32) in ``k.<i>`` / ``v.<i>`` and,
after them, ``k_scales.<i>``, ``k_biases.<i>``, ``v_scales.<i>``, ``v_biases.<i>``.
External blocks (the library API's, ``pack_layers``) hold their caller's per-layer entries
as ``e.<entry>.<n>`` tensors, the entries' shape in their ``layers`` metadata.
"""

from __future__ import annotations

import itertools
import json
import math
import struct
import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omlx.domain.cache.blocks import BlockMeta
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION, EXTERNAL

# Bytes per element, in safetensors' own dtype spelling.
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

# The extra tensors of a quantized KV block, per leaf, in file order after the codes.
QUANT_PARTS = ("k_scales", "k_biases", "v_scales", "v_biases")
METADATA_KEYS = ("format_version", "namespace", "key", "parent_key", "token_count", "layer_count")
_MAX_HEADER = 100_000_000  # safetensors' own limit; a larger length means a broken file
MAX_LAYER_DEPTH = 8  # nesting of an external block's entries (an mlx-lm CacheList's state: 3)


@dataclass(frozen=True, slots=True)
class RawTensor:
    """A tensor as bytes: safetensors dtype name, shape, little-endian row-major data."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    # Where ``data`` starts in the file, for tensors parsed by ``decode_block``.
    offset: int | None = field(default=None, compare=False)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


def encode_header(tensors: Mapping[str, RawTensor], metadata: Mapping[str, str]) -> bytes:
    """A safetensors file's head for ``tensors`` (in the given order): the 8-byte length and
    the JSON header, padded so the tensors' bytes, which follow back to back, start aligned."""
    header: dict[str, object] = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}}
    offset = 0
    for name, tensor in tensors.items():
        if name == "__metadata__":
            raise ValueError("'__metadata__' is not a tensor name")
        if tensor.dtype not in DTYPE_SIZES:
            raise ValueError(f"unknown dtype {tensor.dtype!r} for tensor {name!r}")
        size = memoryview(tensor.data).nbytes
        if size != tensor.nbytes:
            raise ValueError(
                f"tensor {name!r}: {size} bytes for shape {tensor.shape} {tensor.dtype}"
            )
        header[name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)  # data starts 8-byte aligned, as safetensors writes
    return struct.pack("<Q", len(raw)) + raw


def encode_block(tensors: Mapping[str, RawTensor], metadata: Mapping[str, str]) -> bytearray:
    """Serialize ``tensors`` (in the given order) and string ``metadata`` to safetensors bytes."""
    head = encode_header(tensors, metadata)
    # One preallocated buffer, each tensor copied in once: with zero-copy views of the
    # engine's arrays as sources this is the only copy a block costs.
    out = bytearray(len(head) + sum(t.nbytes for t in tensors.values()))
    out[: len(head)] = head
    position = len(head)
    for t in tensors.values():
        view = memoryview(t.data).cast("B")
        out[position : position + len(view)] = view
        position += len(view)
    return out


def decode_block(data: bytes) -> tuple[dict[str, RawTensor], dict[str, str]]:
    """Parse safetensors bytes; tensor data are zero-copy views. Raises ``ValueError`` if malformed."""
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise ValueError("block file shorter than its header length")
    (header_len,) = struct.unpack_from("<Q", view, 0)
    if header_len > min(_MAX_HEADER, len(view) - 8):
        raise ValueError(f"header length {header_len} exceeds the file ({len(view)} bytes)")
    try:
        header = json.loads(bytes(view[8 : 8 + header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"block header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("block header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError("__metadata__ must map strings to strings")
    body = view[8 + header_len :]
    tensors: dict[str, RawTensor] = {}
    spans: list[tuple[int, int]] = []
    for name, info in header.items():
        tensor, span = _parse_entry(name, info, body, 8 + header_len)
        tensors[name] = tensor
        spans.append(span)
    # Like safetensors: the tensors tile the data section exactly, no gaps or overlaps.
    end = 0
    for begin, stop in sorted(spans):
        if begin != end:
            raise ValueError("tensor data offsets leave a gap or overlap")
        end = stop
    if end != len(body):
        raise ValueError(f"data section is {len(body)} bytes, tensors cover {end}")
    return tensors, dict(metadata)


def _parse_entry(
    name: str, info: object, body: memoryview, body_offset: int
) -> tuple[RawTensor, tuple[int, int]]:
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name!r}: entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise ValueError(f"tensor {name!r}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise ValueError(f"tensor {name!r}: bad data_offsets {offsets!r}")
    begin, stop = offsets
    if not begin <= stop <= len(body):
        raise ValueError(f"tensor {name!r}: data_offsets {offsets} outside the data section")
    tensor = RawTensor(dtype, tuple(shape), body[begin:stop], body_offset + begin)
    if stop - begin != tensor.nbytes:
        raise ValueError(f"tensor {name!r}: {stop - begin} bytes for shape {shape} {dtype}")
    return tensor, (begin, stop)


def joined(data: bytes | bytearray | memoryview, parts: Sequence[RawTensor]) -> memoryview | None:
    """One zero-copy view of ``parts``' bytes when they lie back to back, in this order, in ``data``.

    ``parts`` come from ``decode_block(data)``; None when they are not adjacent (another
    tensor order), so the caller gathers them one by one instead.
    """
    if not parts or any(p.offset is None for p in parts):
        return None
    start = end = parts[0].offset
    for part in parts:
        if part.offset != end:
            return None
        end += part.nbytes
    return memoryview(data).cast("B")[start:end]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def tokens_tensor(tokens: Sequence[int]) -> RawTensor:
    """The ``tokens`` tensor: int32 little-endian, shape ``[n]``."""
    return RawTensor("I32", (len(tokens),), struct.pack(f"<{len(tokens)}i", *tokens))


def read_tokens(tensor: RawTensor) -> tuple[int, ...]:
    """Token ids of a ``tokens`` tensor (I32 or U32, one dimension)."""
    if tensor.dtype not in ("I32", "U32") or len(tensor.shape) != 1:
        raise ValueError(f"tokens tensor must be 1-D I32, got {tensor.dtype} {tensor.shape}")
    values = array("i" if tensor.dtype == "I32" else "I")
    values.frombytes(bytes(tensor.data))
    if sys.byteorder == "big":
        values.byteswap()
    return tuple(values)


def block_metadata(meta: BlockMeta, layer_count: int, **extra: str) -> dict[str, str]:
    """The string metadata every object file carries (DESIGN §4), plus its kind's own."""
    return {
        "format_version": str(CACHE_FORMAT_VERSION),
        "kind": meta.kind,
        "namespace": meta.namespace,
        "key": meta.key,
        "parent_key": meta.parent_key,
        "token_count": str(meta.token_count),
        "layer_count": str(layer_count),
        **extra,
    }


def pack_block(
    meta: BlockMeta,
    tokens: Sequence[int],
    layers: Sequence[tuple[RawTensor, RawTensor]],
    *,
    leaves: Sequence[int] | None = None,
    layer_count: int | None = None,
    positions: int | None = None,
    quant: Mapping[str, str] | None = None,
    quant_parts: Sequence[tuple[RawTensor, RawTensor, RawTensor, RawTensor]] = (),
) -> bytes:
    """A KV block file: ``tokens``, every leaf's ``k.<leaf>``, then every ``v.<leaf>``, its metadata.

    The one writer of this layout (the MLX codec encodes through it). ``leaves`` names
    the layer of each of ``layers`` (default ``0..n-1``), ``layer_count`` the model's
    cache leaves (default ``n``), ``positions`` those the KV holds (default its tokens).
    All keys come before all values: each side is one span a reader can take whole.
    A quantized block: ``layers`` hold the codes, ``quant_parts`` each layer's
    (k_scales, k_biases, v_scales, v_biases), ``quant`` its ``kv_bits``,
    ``kv_group_size`` and ``kv_dtype`` metadata.
    """
    if len(tokens) != meta.token_count:
        raise ValueError(f"{len(tokens)} tokens for a block of {meta.token_count}")
    names = list(leaves) if leaves is not None else list(range(len(layers)))
    if len(names) != len(layers):
        raise ValueError(f"{len(names)} leaves named for {len(layers)} layers")
    tensors = {"tokens": tokens_tensor(tokens)}
    tensors.update((f"k.{leaf}", k) for leaf, (k, _) in zip(names, layers, strict=True))
    tensors.update((f"v.{leaf}", v) for leaf, (_, v) in zip(names, layers, strict=True))
    if quant is not None:
        if len(quant_parts) != len(layers) or set(quant) != set(QUANT_METADATA):
            raise ValueError(f"a quantized block needs {QUANT_METADATA} and parts per layer")
        for j, part in enumerate(QUANT_PARTS):
            tensors.update(
                (f"{part}.{leaf}", p[j]) for leaf, p in zip(names, quant_parts, strict=False)
            )
    metadata = block_metadata(
        meta,
        layer_count if layer_count is not None else len(layers),
        leaves=",".join(map(str, names)),
        positions=str(positions if positions is not None else meta.token_count),
        **(quant or {}),
    )
    return encode_block(tensors, metadata)


# An object file parsed: its tokens, its other tensors by name, its metadata.
Unpacked = tuple[tuple[int, ...], dict[str, RawTensor], dict[str, str]]


def unpack_block(data: bytes) -> Unpacked:
    """An object file's tokens, its other tensors by name and its metadata, checked together.

    Refuses another format version (older blocks are collected, never misread), and a
    file whose tensors do not match what its kind's metadata lists.
    """
    tensors, metadata = decode_block(data)
    missing = [k for k in METADATA_KEYS if k not in metadata]
    if missing or "tokens" not in tensors:
        raise ValueError(f"not a block file: missing {missing or ['tokens']}")
    if metadata["format_version"] != str(CACHE_FORMAT_VERSION):
        raise ValueError(f"block format version {metadata['format_version']!r} is not supported")
    tokens = read_tokens(tensors.pop("tokens"))
    try:
        token_count, layer_count = int(metadata["token_count"]), int(metadata["layer_count"])
    except ValueError:
        raise ValueError("token_count and layer_count must be integers") from None
    kind = metadata.get("kind", "kv")
    if kind == EXTERNAL:
        # It covers token_count positions its caller keyed; the tokens are not its to keep.
        if tokens or token_count < 0:
            raise ValueError("an external block carries no tokens and a token count >= 0")
        unpack_layers(tensors, metadata)  # raises on a missing or stray tensor
    elif token_count != len(tokens):
        raise ValueError(f"metadata says {token_count} tokens, tensor has {len(tokens)}")
    elif kind == "state":
        try:
            slots = json.loads(metadata["state_slots"])
            names = {f"s.{leaf}.{j}" for leaf, count in slots for j in range(count)}
        except (KeyError, ValueError, TypeError):
            raise ValueError("a state object needs its state_slots") from None
        if not set(tensors) <= names:
            raise ValueError(f"tensors {sorted(set(tensors) - names)} are not in state_slots")
    else:
        kv_layers(tensors, metadata, layer_count)  # raises on a missing or stray tensor
    return tokens, tensors, metadata


def kv_layers(
    tensors: Mapping[str, RawTensor], metadata: Mapping[str, str], layer_count: int | None = None
) -> list[tuple[int, RawTensor, RawTensor]]:
    """A KV or window object's (leaf, keys, values) per leaf it lists, in order."""
    layer_count = int(metadata["layer_count"]) if layer_count is None else layer_count
    try:
        leaves = [int(x) for x in metadata["leaves"].split(",") if x != ""]
    except (KeyError, ValueError):
        raise ValueError("a KV object needs its leaves") from None
    if any(not 0 <= leaf < layer_count for leaf in leaves) or len(set(leaves)) != len(leaves):
        raise ValueError(f"leaves {leaves} do not fit the layout's {layer_count}")
    parts = ("k", "v", *QUANT_PARTS) if "kv_bits" in metadata else ("k", "v")
    try:
        layers = [(leaf, tensors[f"k.{leaf}"], tensors[f"v.{leaf}"]) for leaf in leaves]
        for leaf in leaves:
            for part in parts[2:]:
                tensors[f"{part}.{leaf}"]
    except KeyError as exc:
        raise ValueError(f"block file lacks tensor {exc.args[0]}") from None
    if len(tensors) != len(parts) * len(leaves):
        raise ValueError("block file has tensors its leaves do not list")
    return layers


QUANT_METADATA = ("kv_bits", "kv_group_size", "kv_dtype")


def quant_parts(
    tensors: Mapping[str, RawTensor], leaf: int
) -> tuple[RawTensor, RawTensor, RawTensor, RawTensor]:
    """A quantized leaf's (k_scales, k_biases, v_scales, v_biases); ``kv_layers`` checked them."""
    k_s, k_b, v_s, v_b = (tensors[f"{part}.{leaf}"] for part in QUANT_PARTS)
    return k_s, k_b, v_s, v_b


def pack_layers(meta: BlockMeta, layers: Sequence[Any]) -> bytearray:
    """An external block file: empty ``tokens``, each entry's tensors, the entries' shape.

    ``layers`` holds one entry per layer: a tree of ``RawTensor``, ``None``, ints, strings,
    tuples and lists (a ``(keys, values)`` pair, an mlx-lm cache's ``state``, which for a
    ``CacheList`` names its caches' classes). The ``layers``
    metadata records each tree with tensor names in the tensors' places, so
    :func:`unpack_layers` gives back the very same shape, tuples as tuples.
    """
    if meta.kind != EXTERNAL:
        raise ValueError(f"pack_layers writes external blocks, not {meta.kind!r} objects")
    tensors: dict[str, RawTensor] = {"tokens": tokens_tensor(())}
    docs = []
    for i, layer in enumerate(layers):
        docs.append(_layer_doc(layer, _namer(tensors, i), f"entry {i}", 0))
    layers_json = json.dumps(docs, separators=(",", ":"))
    return encode_block(tensors, block_metadata(meta, len(layers), layers=layers_json))


def unpack_layers(tensors: Mapping[str, RawTensor], metadata: Mapping[str, str]) -> list[Any]:
    """An external block's entries, ``RawTensor`` in the tensors' places; every tensor used once."""
    try:
        docs = json.loads(metadata["layers"])
    except (KeyError, ValueError):
        raise ValueError("an external block needs its layers") from None
    if not isinstance(docs, list) or len(docs) != int(metadata["layer_count"]):
        raise ValueError("an external block's layers do not match its layer_count")
    used: set[str] = set()
    layers = [_layer_of(doc, tensors, used, f"entry {i}", 0) for i, doc in enumerate(docs)]
    if used != set(tensors):
        raise ValueError(f"tensors {sorted(set(tensors) - used)} are in no layer")
    return layers


def _namer(tensors: dict[str, RawTensor], entry: int) -> Callable[[RawTensor], str]:
    """Adds an entry's tensors to ``tensors`` as ``e.<entry>.<n>``, in depth-first order."""
    count = itertools.count()

    def name_of(tensor: RawTensor) -> str:
        name = f"e.{entry}.{next(count)}"
        tensors[name] = tensor
        return name

    return name_of


def _layer_doc(value: Any, name_of: Callable[[RawTensor], str], where: str, depth: int) -> Any:
    """JSON for one entry: a tensor's name, null, an int, ``{"s": text}`` (a string), a list,
    or ``{"t": [...]}`` (a tuple)."""
    if depth > MAX_LAYER_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_LAYER_DEPTH} levels")
    if isinstance(value, RawTensor):
        return name_of(value)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, tuple | list):
        items = [_layer_doc(v, name_of, f"{where}[{j}]", depth + 1) for j, v in enumerate(value)]
        return {"t": items} if isinstance(value, tuple) else items
    raise ValueError(f"{where}: a {type(value).__name__} cannot be stored in a block")


def _layer_of(
    doc: Any, tensors: Mapping[str, RawTensor], used: set[str], where: str, depth: int
) -> Any:
    if depth > MAX_LAYER_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_LAYER_DEPTH} levels")
    if isinstance(doc, str):
        if doc not in tensors or doc in used:
            raise ValueError(f"{where} names tensor {doc!r}, missing or named twice")
        used.add(doc)
        return tensors[doc]
    if doc is None or (isinstance(doc, int) and not isinstance(doc, bool)):
        return doc
    if isinstance(doc, dict) and set(doc) == {"s"} and isinstance(doc["s"], str):
        return doc["s"]
    if isinstance(doc, dict) and set(doc) == {"t"} and isinstance(doc["t"], list):
        return tuple(
            _layer_of(d, tensors, used, f"{where}[{j}]", depth + 1) for j, d in enumerate(doc["t"])
        )
    if isinstance(doc, list):
        return [_layer_of(d, tensors, used, f"{where}[{j}]", depth + 1) for j, d in enumerate(doc)]
    raise ValueError(f"{where}: {doc!r} is not part of a layer")
