"""omlx: a local LLM server on MLX whose KV cache outlives requests and restarts."""

__version__ = "0.1.0"
