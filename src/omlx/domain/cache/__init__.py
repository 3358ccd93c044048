"""The block cache: keys, block values, its ports, the hot and cold tiers, matching, restore
points.

Its API is re-exported by ``omlx.domain``, not here: this package's modules import one
another (the ports import the block values, the tiers the ports), so re-exporting them
all from here would make importing any one of them run the whole package first.
"""
