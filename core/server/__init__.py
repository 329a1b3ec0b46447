"""The ampkit HTTP server (needs the `server` extra)."""

from __future__ import annotations

from typing import Optional

from ..config import Settings
from ..service import MemoryService
from .app import create_app
from .http import uvicorn_options

__all__ = ["create_app", "run"]


def run(settings: Settings, service: Optional[MemoryService] = None) -> None:
    """Serve until interrupted; `service` (built from `settings` when absent) is opened by the app."""
    import uvicorn

    uvicorn.run(create_app(settings, service), host=settings.host, port=settings.port, log_level="info",
                access_log=settings.access_log,
                **uvicorn_options(settings.max_header_bytes))
