"""docs/library.md's example: run it twice; the second run restores the block from disk."""

import hashlib
import struct
import sys
from pathlib import Path

import mlx.core as mx

from omlx.cache.factory import CacheConfig, CacheFactory

folder = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/omlx-library-demo")
config = CacheConfig(
    block_size=64,
    paged_ssd_cache_dir=folder,  # the server's own folder is ~/.omlx/cache
    max_paged_ssd_cache_size="10GB",  # for every model in the folder together
    hot_cache_max_size="1GB",  # the RAM tier
)
paged = CacheFactory.create_paged_cache(config, num_layers=2)
ssd = CacheFactory.create_paged_ssd_cache(config, model_name="demo-model")
cache = CacheFactory.create_prefix_cache(config, paged_cache=paged, paged_ssd_cache=ssd)

# Name a block by what it holds: here, a SHA-256 of its 64 token ids.
tokens = list(range(64))
block_hash = hashlib.sha256(struct.pack("<64I", *tokens)).digest()

found = cache.load_block(block_hash)
if found is None:
    # The model's KV for these tokens: one (keys, values) pair per layer.
    keys = mx.random.normal((1, 4, 64, 32)).astype(mx.bfloat16)
    values = mx.random.normal((1, 4, 64, 32)).astype(mx.bfloat16)
    cache.save_block(block_hash, [(keys, values), (keys * 2, values * 2)], token_count=64)
    print("computed and saved the block; run again to restore it")
else:
    keys = found[0][0]
    print(f"restored {len(found)} layers from disk: keys {keys.shape} {keys.dtype}")

for meta in ssd.list_blocks():  # oMLX spells it ssd._index.get_all_metadata()
    print(f"{meta.block_hash.hex()[:12]}: {meta.file_size} bytes, {meta.token_count} tokens")
