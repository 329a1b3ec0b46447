"""The memory inspector: web pages at /ui to see, search, correct and approve what agents
remember (needs the `server` extra: Starlette, Jinja2, python-multipart). See docs/inspector.md."""

from __future__ import annotations

from .app import create_inspector_app

__all__ = ["create_inspector_app"]
