"""Request checks both API families share."""

from __future__ import annotations

from omlx.app.api.errors import APIError
from omlx.app.container import Container


def check_model(container: Container, model: str) -> None:
    if model not in container.model_ids:
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {', '.join(sorted(container.model_ids))}",
            param="model",
            code="model_not_found",
        )
