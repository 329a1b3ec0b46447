"""The composition root: the one place that loads `Settings` and builds what they describe.

    settings = load_settings(port=9000)       # init args > AMPKIT_* env > .env > defaults
    service = build_service(settings)         # store (not opened), retriever, limits, policy

The server, the CLI and the in-process clients all come through here, so they run the same
store, limits, lifecycle policy and retriever. The core modules (`service`, `retrieval`,
`store`, `embeddings`) never read settings: they take what they need as arguments.

An embedder is built once per process and name and shared by every service that names it:
loading the default model costs 0.2-0.9 s, which an in-process client would otherwise pay
each time it is constructed.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, Callable, Optional

from .config import Settings
from .embeddings import embedder_from_name
from .models import utcnow
from .retrieval import Embedder, Retriever
from .service import MemoryService
from .store import Store, store_from_url

_embedders: dict[str, Optional[Embedder]] = {}
_embedders_lock = threading.Lock()


def load_settings(*, env: bool = True, **overrides: Any) -> Settings:
    """Settings from `AMPKIT_*` variables and `.env` (with `env=False`: the defaults only),
    with `overrides` (None values ignored, so CLI flags left unset change nothing) on top."""
    given = {name: value for name, value in overrides.items() if value is not None}
    if env:
        return Settings(**given)
    defaults = {name: field.default for name, field in Settings.model_fields.items()}
    return Settings(_env_file=None, **{**defaults, **given})


def settings_for_store(url: str) -> Settings:
    """What an in-process client runs with: the store it was given, everything else from the
    `AMPKIT_*` environment (not from a `.env` in whatever directory the program runs in)."""
    return Settings(_env_file=None, store=url)


def cached_embedder(name: str) -> Optional[Embedder]:
    """The embedder `name` describes, built once per process."""
    with _embedders_lock:
        if name not in _embedders:
            _embedders[name] = embedder_from_name(name)
        return _embedders[name]


def retriever_from_settings(settings: Settings) -> Retriever:
    return Retriever(embedder=cached_embedder(settings.embedder))


def store_from_settings(settings: Settings) -> Store:
    """The store (built, not opened) at `settings.store_url()`, with the SQLite options."""
    url = settings.store_url()
    options = {"synchronous": settings.sqlite_synchronous} if url.startswith("sqlite") else {}
    return store_from_url(url, **options)


def build_service(settings: Settings, *, clock: Callable[[], datetime] = utcnow) -> MemoryService:
    """The service a Settings describes (its store not opened)."""
    return MemoryService(
        store=store_from_settings(settings),
        policy=settings.lifecycle_policy(),
        limits=settings.limits(),
        retriever=retriever_from_settings(settings),
        clock=clock,
        allow_clock_override=settings.allow_clock_override,
    )


__all__ = [
    "build_service", "cached_embedder", "load_settings", "retriever_from_settings", "settings_for_store",
    "store_from_settings",
]
