"""The image rows file: one image's encoder output, a plain safetensors file beside the blocks.

One tensor, ``rows`` (``[rows, hidden]`` in the model's float dtype: F32, F16 or BF16),
and the metadata every object file carries (``block_metadata``: kind ``image``, its key,
namespace and anchor as ``parent_key``, ``token_count`` = its rows) plus the image's
``digest``. Bytes only: the MLX adapter turns arrays into ``RawTensor`` and back, and
``omlx admin cache verify`` checks a file here without the model.
"""

from __future__ import annotations

from omlx.adapters.blockfiles.format import (
    RawTensor,
    block_metadata,
    decode_block,
    encode_block,
)
from omlx.domain.cache.blocks import BlockMeta, StoredBlock
from omlx.domain.cache.keys import CACHE_FORMAT_VERSION, IMAGE, rederives

ROWS = "rows"
ROW_DTYPES = ("F32", "F16", "BF16")


def pack_image_rows(meta: BlockMeta, rows: RawTensor, digest: str) -> bytearray:
    """The file of an image's ``rows``: ``meta`` names the object (kind ``image``)."""
    if meta.kind != IMAGE or len(rows.shape) != 2 or rows.shape[0] != meta.token_count:
        raise ValueError(f"rows {rows.shape} are no {meta.token_count}-row image object")
    if rows.dtype not in ROW_DTYPES:
        raise ValueError(f"image rows in {rows.dtype} are not stored")
    return encode_block({ROWS: rows}, block_metadata(meta, 0, digest=digest))


def unpack_image_rows(data: bytes) -> tuple[RawTensor, dict[str, str]]:
    """The ``rows`` tensor of an image rows file and its metadata; ``ValueError`` if malformed."""
    tensors, metadata = decode_block(data)
    rows = tensors.get(ROWS)
    if set(tensors) != {ROWS} or rows is None:
        raise ValueError(f"an image rows file holds one 'rows' tensor, not {sorted(tensors)}")
    if rows.dtype not in ROW_DTYPES or len(rows.shape) != 2:
        raise ValueError(f"image rows must be 2-D F32, F16 or BF16, got {rows.dtype} {rows.shape}")
    if metadata.get("kind") != IMAGE:
        raise ValueError(f"the file holds a {metadata.get('kind')!r} object, not image rows")
    if metadata.get("format_version") != str(CACHE_FORMAT_VERSION):
        raise ValueError(f"block format {metadata.get('format_version')!r}")
    if metadata.get("token_count") != str(rows.shape[0]):
        raise ValueError(f"{rows.shape[0]} rows, the metadata says {metadata.get('token_count')}")
    return rows, metadata


def image_file_problem(data: bytes, meta: BlockMeta, digest: str | None = None) -> str | None:
    """Why ``data`` is not the image rows object ``meta`` names (of ``digest``, when the
    caller knows it), or None. Never raises."""
    try:
        rows, metadata = unpack_image_rows(data)
    except ValueError as exc:
        return f"malformed: {exc}"
    if metadata.get("key") != meta.key or metadata.get("namespace") != meta.namespace:
        return "its metadata names another object"
    if metadata.get("parent_key") != meta.parent_key:
        return "its metadata names another image or tenant"
    if not rederives(IMAGE, meta.key, meta.parent_key, (), meta.namespace):
        return "its key does not follow from its anchor"
    if digest is not None and metadata.get("digest") != digest:
        return "its metadata names another image"
    if rows.shape[0] != meta.token_count:
        return f"{rows.shape[0]} rows, the index says {meta.token_count}"
    return None


def check_image_block(data: bytes, block: StoredBlock) -> str | None:
    """``image_file_problem`` of an indexed row's file (``omlx admin cache verify``)."""
    meta = BlockMeta(block.key, block.parent_key, block.namespace, block.token_count, IMAGE)
    return image_file_problem(data, meta)
