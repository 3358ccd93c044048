"""The engine: one thread running mlx-lm's continuous batcher, with omlx's own decode steps."""
