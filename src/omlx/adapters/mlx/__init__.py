"""The MLX adapter: ``models/`` load, ``cache/`` cuts and joins blocks, ``batch/`` runs the engine,
all over ``mlx_lm_private/``, the one door to mlx-lm's private state."""

from omlx.adapters.mlx.mlx_lm_private.light_import import install

install()  # the first import of mlx-lm below this package skips transformers (light_import)
