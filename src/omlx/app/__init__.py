"""omlx."""
