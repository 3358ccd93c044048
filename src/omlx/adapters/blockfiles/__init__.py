"""Block files: the safetensors format, the on-disk store, the writer thread, the folder lock."""

from __future__ import annotations

from omlx.adapters.blockfiles.budget import DiskBudget, default_reserve
from omlx.adapters.blockfiles.format import (
    RawTensor,
    decode_block,
    encode_block,
    pack_block,
    read_tokens,
    tokens_tensor,
    unpack_block,
)
from omlx.adapters.blockfiles.lock import CacheDirLock, CacheDirLocked, is_locked, lock_holder
from omlx.adapters.blockfiles.store import FileBlockStore, safe_folder_name
from omlx.adapters.blockfiles.writer import BlockWriter, WriteJob, WriterStats

__all__ = [
    "BlockWriter",
    "CacheDirLock",
    "CacheDirLocked",
    "DiskBudget",
    "FileBlockStore",
    "RawTensor",
    "WriteJob",
    "WriterStats",
    "decode_block",
    "default_reserve",
    "encode_block",
    "is_locked",
    "lock_holder",
    "pack_block",
    "read_tokens",
    "safe_folder_name",
    "tokens_tensor",
    "unpack_block",
]
