"""The composition root: settings in, a running container of services out."""
