"""The ampkit HTTP server (needs the `server` extra)."""

from __future__ import annotations

from ..config import Settings
from .app import create_app

__all__ = ["create_app", "run"]


def run(settings: Settings) -> None:
    import uvicorn

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="info")
