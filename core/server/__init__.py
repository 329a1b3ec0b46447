"""The ampkit HTTP server (needs the `server` extra)."""

from __future__ import annotations

from typing import Any

import uvicorn  # imported with the app, before a store's warm-ups start (see `ampkit serve`)

from ..config import Settings
from .app import create_app
from .http import uvicorn_options

__all__ = ["create_app", "run"]


def run(settings: Settings, app: Any = None) -> None:
    """Serve `app` (by default one built from `settings`) until interrupted; the app opens
    its service's store."""
    uvicorn.run(app if app is not None else create_app(settings), host=settings.host, port=settings.port, log_level="info",
                access_log=settings.access_log,
                **uvicorn_options(settings.max_header_bytes))
