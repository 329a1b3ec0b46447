"""The ampkit HTTP server (needs the `server` extra)."""

from __future__ import annotations

from typing import Optional

from ..config import Settings
from ..service import MemoryService
from .app import create_app

__all__ = ["create_app", "run"]


def run(settings: Settings, service: Optional[MemoryService] = None) -> None:
    """Serve until interrupted; `service` (built from `settings` when absent) is opened by the app."""
    import uvicorn

    # h11 rather than httptools: h11 bounds the request head (headers), so a client cannot
    # make the server buffer megabytes of headers; an oversized head is refused with 400.
    uvicorn.run(create_app(settings, service), host=settings.host, port=settings.port, log_level="info",
                http="h11", h11_max_incomplete_event_size=settings.max_header_bytes)
