"""The MLX adapter: ``models/`` load, ``cache/`` cuts and joins blocks, ``batch/`` runs the engine,
all over ``mlx_lm_private/``, the one door to mlx-lm's private state."""
