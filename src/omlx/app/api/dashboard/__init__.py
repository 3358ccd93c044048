"""The dashboard: a page served by omlx itself, its JSON state route and its actions."""

from __future__ import annotations

from omlx.app.api.dashboard.controller import (
    ApiFamily,
    Dashboard,
    DashboardController,
    DashboardPageController,
)
from omlx.app.api.dashboard.series import RequestSeries, SeriesPoint

__all__ = [
    "ApiFamily",
    "Dashboard",
    "DashboardController",
    "DashboardPageController",
    "RequestSeries",
    "SeriesPoint",
]
