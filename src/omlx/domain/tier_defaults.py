"""The cache tiers' default byte budgets, written once.

The server's settings, the ``omlx.cache`` library and the disk budget all start from
these; config/omlx.toml shows them to people (``tests/unit/test_guide.py`` keeps the
TOML and the settings in step).
"""

from __future__ import annotations

from omlx.domain.sizes import parse_size

HOT_TIER_DEFAULT = "2GB"  # RAM for blocks, per model
COLD_TIER_DEFAULT = "100GB"  # block files on disk, as oMLX documents (DESIGN §4)

HOT_TIER_DEFAULT_BYTES = parse_size(HOT_TIER_DEFAULT)
COLD_TIER_DEFAULT_BYTES = parse_size(COLD_TIER_DEFAULT)
