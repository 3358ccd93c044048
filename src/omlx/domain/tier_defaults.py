"""The cache tiers' default byte budgets, written once.

The server's settings, the ``omlx.cache`` library and the disk budget all start from
these; config/omlx.toml shows them to people (``tests/unit/test_guide.py`` keeps the
TOML and the settings in step).

The server's hot tier is ``auto`` by default: a fixed size cannot suit both a 135M model
(46 KB of KV per token: 2 GB holds 45k tokens) and an 8B one (128-256 KB: 2 GB holds
less than one 16k-token agent session, so every turn would read the rest from disk).
``auto_hot_tier_bytes`` sizes it per model from its KV bytes per token and the RAM the
memory guard allows.
"""

from __future__ import annotations

from omlx.domain.sizes import parse_size

AUTO = "auto"
HOT_TIER_DEFAULT = AUTO  # the server's: RAM for blocks, per model, sized at load
COLD_TIER_DEFAULT = "100GB"  # block files on disk, as oMLX documents (DESIGN §4)

# The library's hot tier (it knows no model until asked) and the floor of ``auto``.
HOT_TIER_DEFAULT_BYTES = parse_size("2GB")
COLD_TIER_DEFAULT_BYTES = parse_size(COLD_TIER_DEFAULT)

# ``auto`` aims to hold this many tokens of a model's KV: an agent's main session at
# 64k tokens plus as much again for its sub-agents, side calls and a second session.
HOT_TIER_AUTO_TOKENS = 131_072
# ... within this share of the KV memory guard's limit: the rest stays for running
# requests (the hot tier gives memory back to them anyway, but a restored conversation
# is held twice while it runs: as blocks, and in the request's cache).
HOT_TIER_AUTO_GUARD_SHARE = 0.5


def auto_hot_tier_bytes(kv_bytes_per_token: int, kv_memory_bytes: int | None) -> int:
    """The hot tier of a model with ``kv_bytes_per_token``, under a guard of ``kv_memory_bytes``.

    ``HOT_TIER_AUTO_TOKENS`` of its KV, at least ``HOT_TIER_DEFAULT_BYTES`` (a small model
    keeps what it always had), at most ``HOT_TIER_AUTO_GUARD_SHARE`` of the guard's limit
    (which wins over the floor on a machine with little RAM). ``kv_memory_bytes`` None:
    no cap known.
    """
    want = max(kv_bytes_per_token, 0) * HOT_TIER_AUTO_TOKENS
    size = max(want, HOT_TIER_DEFAULT_BYTES)
    if kv_memory_bytes is not None:
        size = min(size, int(kv_memory_bytes * HOT_TIER_AUTO_GUARD_SHARE))
    return size
