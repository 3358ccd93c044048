"""Every private name omlx uses of mlx-lm, behind one version check."""
