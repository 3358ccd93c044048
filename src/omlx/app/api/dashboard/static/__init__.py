"""The dashboard page's files, shipped as package data (pyproject.toml)."""
