"""What a namespace's object files must hold, and the check of one file against it.

A ``BlockSpec`` is read off the files the engine itself writes for one position of the
model (``adapters.mlx.cache.expected_blocks``): per object kind, every tensor's name,
safetensors dtype and shape (the token axis left open), the metadata values that must
match (layer count, quantization), the block size and the vocabulary size. It is kept
as JSON in the index's namespace row, so ``omlx admin cache verify`` checks files
without loading the model. No MLX here; numpy only to scan values.

What a file can be checked for: its layers, shapes, dtypes, token count and token ids,
and that its floats are finite. What it cannot: whether finite values are the ones the
model computes for those tokens (a block of random or zero KV is well formed); only
recomputing it would tell, which costs what the cache saves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from omlx.adapters.blockfiles.format import RawTensor, Unpacked, unpack_block
from omlx.domain.cache.image_keys import IMAGE_ID_BASE, IMAGE_ID_SPAN
from omlx.domain.cache.keys import EXTERNAL, KV, STATE

# Metadata a file of a kind must carry exactly as the engine writes it (when it does).
MATCHED_METADATA = ("layer_count", "kv_bits", "kv_group_size", "kv_dtype", "state_slots")
# KV and window tensors are (1, kv_heads, positions, width): the token axis.
TOKEN_AXIS = 2
_FLOATS = ("F32", "F16", "BF16")
_EXPONENT_BITS = {"F16": 0x7C00, "BF16": 0x7F80}

Shape = tuple[int | None, ...]  # None: the token axis, as long as the block


@dataclass(frozen=True, slots=True)
class ObjectSpec:
    """One kind of object file: tensor name -> (dtype, shape), metadata that must match."""

    tensors: Mapping[str, tuple[str, Shape]]
    metadata: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class BlockSpec:
    """What every object file of one namespace holds (see the module docstring)."""

    block_size: int
    vocab_size: int
    kinds: Mapping[str, ObjectSpec]
    # A vision-language model's blocks also hold images' key ids (domain/cache/image_keys).
    image_ids: bool = False

    @classmethod
    def from_files(
        cls, block_size: int, vocab_size: int, files: Mapping[str, bytes], image_ids: bool = False
    ) -> BlockSpec:
        """The spec read off one engine-written file per kind (any token count)."""
        kinds = {}
        for kind, data in files.items():
            _, tensors, metadata = unpack_block(data)
            shapes = {
                name: (t.dtype, _open_token_axis(t.shape) if kind != STATE else t.shape)
                for name, t in tensors.items()
            }
            matched = {k: metadata[k] for k in MATCHED_METADATA if k in metadata}
            kinds[kind] = ObjectSpec(shapes, matched)
        return cls(block_size, vocab_size, kinds, image_ids)

    def to_json(self) -> str:
        doc = {
            "block_size": self.block_size,
            "vocab_size": self.vocab_size,
            "kinds": {
                kind: {
                    "tensors": {n: [d, list(s)] for n, (d, s) in spec.tensors.items()},
                    "metadata": dict(spec.metadata),
                }
                for kind, spec in self.kinds.items()
            },
        }
        if self.image_ids:  # absent for text models: their stored specs read as before
            doc["image_ids"] = True
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BlockSpec:
        """Raises ``ValueError`` on a document this version did not write."""
        try:
            doc = json.loads(text)
            kinds = {
                kind: ObjectSpec(
                    {n: (d, tuple(s)) for n, (d, s) in spec["tensors"].items()},
                    dict(spec["metadata"]),
                )
                for kind, spec in doc["kinds"].items()
            }
            return cls(
                int(doc["block_size"]),
                int(doc["vocab_size"]),
                kinds,
                bool(doc.get("image_ids", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a block spec: {exc}") from None


def _open_token_axis(shape: tuple[int, ...]) -> Shape:
    return tuple(None if i == TOKEN_AXIS else d for i, d in enumerate(shape))


def file_problem(
    spec: BlockSpec, data: bytes, *, values: bool = True, parsed: Unpacked | None = None
) -> str | None:
    """Why the object file ``data`` is not one this namespace's engine writes, or None;
    ``values``: scan its floats too (every byte: imports and ``verify``, not each read);
    ``parsed``: ``unpack_block(data)`` where the caller has it already."""
    try:
        tokens, tensors, metadata = parsed if parsed is not None else unpack_block(data)
    except ValueError as exc:
        return f"it cannot be parsed ({exc})"
    kind = metadata.get("kind", KV)
    if kind == EXTERNAL:  # the library API's: its caller's layers, checked by their hash
        return None
    return (
        tokens_problem(spec, tokens)
        or metadata_problem(spec, kind, metadata, len(tokens))
        or layout_problem(
            spec, kind, {n: (t.dtype, t.shape) for n, t in tensors.items()}, len(tokens)
        )
        or (values_problem(tensors) if values else None)
    )


def tokens_problem(spec: BlockSpec, tokens: tuple[int, ...]) -> str | None:
    """A block holds 1 to ``block_size`` tokens, each an id of the vocabulary (or, for a
    vision-language model, an image's key id)."""
    if not 1 <= len(tokens) <= spec.block_size:
        return f"it holds {len(tokens)} tokens; a block holds 1 to {spec.block_size}"
    outside = [
        t
        for t in tokens
        if not 0 <= t < spec.vocab_size
        and not (spec.image_ids and IMAGE_ID_BASE <= t < IMAGE_ID_BASE + IMAGE_ID_SPAN)
    ]
    if outside:
        return f"its token id {outside[0]} is outside the vocabulary (0 to {spec.vocab_size - 1})"
    return None


def metadata_problem(
    spec: BlockSpec, kind: str, metadata: Mapping[str, str], token_count: int
) -> str | None:
    expected = spec.kinds.get(kind)
    if expected is None:
        return f"this model keeps no {kind} objects"
    for key in MATCHED_METADATA:
        want, got = expected.metadata.get(key), metadata.get(key)
        if want != got:
            return f"its {key} is {got!r}, this model's {want!r}"
    if kind != STATE and metadata.get("positions") != str(token_count):
        return f"its KV covers {metadata.get('positions')} positions for {token_count} tokens"
    return None


def layout_problem(
    spec: BlockSpec, kind: str, tensors: Mapping[str, tuple[str, tuple[int, ...]]], positions: int
) -> str | None:
    """The tensors (name -> dtype, shape) against the kind's: same names, dtypes and shapes,
    the token axis ``positions`` long."""
    expected = spec.kinds.get(kind)
    if expected is None:
        return f"this model keeps no {kind} objects"
    missing = sorted(set(expected.tensors) - set(tensors))
    if missing:
        return f"it lacks the model's tensors {_names(missing)}"
    extra = sorted(set(tensors) - set(expected.tensors))
    if extra:
        return f"it holds tensors the model has no layer for: {_names(extra)}"
    for name, (dtype, shape) in expected.tensors.items():
        got_dtype, got_shape = tensors[name]
        if got_dtype != dtype:
            return f"its tensor {name} is {got_dtype}, the model's is {dtype}"
        want = tuple(positions if d is None else d for d in shape)
        if tuple(got_shape) != want:
            return f"its tensor {name} is shaped {list(got_shape)}, the model's {list(want)}"
    return None


def values_problem(tensors: Mapping[str, RawTensor]) -> str | None:
    """The first float tensor holding a NaN or an infinity, named; codes (U32) are any bits."""
    import numpy as np

    for name, t in tensors.items():
        if t.dtype not in _FLOATS or not t.nbytes:
            continue
        if t.dtype == "F32":
            # One pass, no temporary: a NaN or inf anywhere makes the sum non-finite, and
            # float64 cannot overflow on float32 values (~7 GB/s here).
            values = np.frombuffer(t.data, np.float32)
            finite = bool(np.isfinite(values.sum(dtype=np.float64)))
        else:  # 16 bits (numpy has no bfloat16): NaN and inf are the all-ones exponent
            exponent = _EXPONENT_BITS[t.dtype]
            bits = np.frombuffer(t.data, np.uint16)
            finite = int(np.bitwise_and(bits, exponent).max()) != exponent
        if not finite:
            return f"its tensor {name} holds non-finite values (NaN or infinity)"
    return None


def _names(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def spec_of(text: str | None) -> BlockSpec | None:
    """The spec in an index row's text, None when none was recorded (or it cannot be read)."""
    if not text:
        return None
    try:
        return BlockSpec.from_json(text)
    except ValueError:
        return None
