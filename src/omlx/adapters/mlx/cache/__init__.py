"""The block cache's MLX side: cutting caches into blocks, joining them back, their layout."""
