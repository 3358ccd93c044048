"""The block cache: keys, block values, the hot and cold tiers, matching, restore points.

Its API is re-exported by ``omlx.domain``, not here: ``domain/ports.py`` (one floor up)
imports this package's values, and the cache's modules import the ports, so importing
them all here would make ``import omlx.domain.ports`` run in a circle.
"""
