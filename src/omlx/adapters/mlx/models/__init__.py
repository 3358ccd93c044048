"""Loading models: mlx-lm folders, GGUF files and their prepared copies, drafts and encoders."""
