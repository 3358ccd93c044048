"""Image rows (an MLX array ``[rows, hidden]``) as the bytes of their file, and back.

Implements the domain's ``RowsCodec`` over ``blockfiles.image_files``; engine thread
only: ``encode`` materializes the array into bytes, so the writer thread never touches
MLX. bf16 travels as its uint16 bits (numpy has no bfloat16), as KV blocks do.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from omlx.adapters.blockfiles.format import RawTensor
from omlx.adapters.blockfiles.image_files import (
    image_file_problem,
    pack_image_rows,
    unpack_image_rows,
)
from omlx.adapters.mlx.cache.join import to_host
from omlx.domain.cache.blocks import BlockMeta

_TO_ST = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}
_FROM_ST = {
    "F32": (np.float32, mx.float32),
    "F16": (np.float16, mx.float16),
    "BF16": (np.uint16, mx.bfloat16),
}


class MLXRowsCodec:
    """``RowsCodec`` for MLX arrays."""

    def info(self, payload: mx.array) -> tuple[int, int, str]:
        rows, hidden = payload.shape
        return int(rows), int(hidden), _st_name(payload.dtype)

    def nbytes(self, payload: mx.array) -> int:
        return int(payload.nbytes)

    def encode(self, payload: mx.array, meta: BlockMeta) -> bytes:
        if meta.image is None:
            raise ValueError("image rows need their image's digest")
        host = np.ascontiguousarray(to_host(payload))
        tensor = RawTensor(_st_name(payload.dtype), tuple(host.shape), host.tobytes())
        return bytes(pack_image_rows(meta, tensor, meta.image.digest))

    def decode(self, data: bytes, meta: BlockMeta) -> mx.array:
        problem = image_file_problem(data, meta)
        if problem is not None:
            raise ValueError(problem)
        rows, _ = unpack_image_rows(data)
        np_dtype, dtype = _FROM_ST[rows.dtype]
        host = np.frombuffer(rows.data, np_dtype).reshape(rows.shape)
        array = mx.array(host)
        return array.view(dtype) if dtype == mx.bfloat16 else array


def _st_name(dtype: Any) -> str:
    name = _TO_ST.get(dtype)
    if name is None:
        raise ValueError(f"image rows in {dtype} are not stored")
    return name
