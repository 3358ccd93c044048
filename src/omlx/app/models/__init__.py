"""The served models: the catalog, their names, the pool that loads them, encoders."""
